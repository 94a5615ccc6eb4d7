// attnlab attention viewer: talks to the JSON API of attnlab/viewer/app.py and renders the page.
// No build step and no dependencies, so the page works offline from the installed package.
// Weights arrive as the lower triangle (row i: keys 0..i); later keys are masked to 0.
// Requests and their answers' decoding live in api.js, canvas drawing in draw.js, the Generate
// panel in generation.js, the token chips' pointer and keyboard handling in chips.js.
import { api, attention } from "./api.js";
import { asButton, clickOnKeys, wireChips } from "./chips.js";
import { $, setStatus } from "./dom.js";
import {
  cellAt, colour, drawCells, drawHeatmap, drawMini, headImage, inkFor, placeTip, rampEnd, sees,
  shown,
} from "./draw.js";
import { wireGeneration } from "./generation.js";

const state = {
  model: null,        // GET /api/model
  ids: [],            // token ids of the text on show
  tokens: [],         // [{id, text}]
  layers: new Map(),  // layer index -> {heads, future_max, norms} for the current ids
  layer: 0,
  head: 0,            // a head index, or "all"
  hover: null,        // query token under the pointer
  pinned: null,       // query token clicked
  generatedFrom: null, // index of the first generated token, when showing a generation
  pending: null,      // {input, generatedFrom} of the analysis in flight
  seq: 0,             // drops answers to requests that a newer one replaced
  chips: [],
  geometry: null,     // where the heatmap cells are, for hit testing
  images: new Map(),  // "layer/head/rowscale" -> the head drawn as a T x T image
  minis: [],          // canvases of the all-heads grid
  timings: {},        // milliseconds of the last fetch / render / highlight (read by tests)
};
window.attnlab = state;

// ------------------------------------------------------------------ model and controls

function fmtCount(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : `${n}`;
}

/** The model family's switches that differ from GPT-2's, in words (config.py's fields). */
function switches(c) {
  const out = [];
  const kv = c.n_kv_head ?? c.n_head;
  if (kv !== c.n_head) out.push(`GQA ${kv} kv heads`);
  if (c.pos === "rope") {
    const pct = c.rotary_pct < 1 ? ` on ${Math.round(c.rotary_pct * 100)}% of dims` : "";
    const scaling = c.rope_scaling ? `, ${c.rope_scaling.rope_type ?? c.rope_scaling.type} scaling` : "";
    out.push(`RoPE θ=${c.rope_theta}${pct}${scaling}`);
  } else if (c.pos === "none") out.push("no positions");
  if (c.norm === "rmsnorm") out.push("RMSNorm");
  else if (c.norm === "none") out.push("no norm");
  if (c.mlp === "swiglu") out.push("SwiGLU");
  else if (c.mlp === "none" || c.mlp === false) out.push("no MLP");
  if (c.head_dim) out.push(`head_dim ${c.head_dim}`);
  if (c.qk_norm) out.push("QK-norm");
  if (c.parallel_residual) out.push("parallel residual");
  if (c.sliding_window) out.push(`window ${c.sliding_window}`);
  if (c.n_experts) out.push(`${c.n_experts} experts, top ${c.experts_per_token}`);  // the Routing panel
  return out;
}

async function loadModel() {
  const m = await api("/api/model");
  state.model = m;
  const c = m.config;
  const parts = [
    `${c.n_layer} layers × ${c.n_head} heads`, `${c.n_embd} dims`, `block ${c.block_size}`,
    `${fmtCount(m.n_params)} params`, `${m.tokenizer.name} tokenizer (${m.tokenizer.vocab_size})`,
  ];
  parts.splice(1, 0, ...switches(c));
  const meta = m.meta || {};
  if (meta.step !== undefined) parts.push(`trained ${meta.step} steps`);
  const loss = meta.val_loss ?? meta.loss;
  if (typeof loss === "number") parts.push(`loss ${loss.toFixed(3)}`);
  // per token losses of different tokenizers do not compare; bits per byte of text do
  if (typeof meta.val_bpb === "number") parts.push(`${meta.val_bpb.toFixed(3)} bits/byte`);
  $("model-info").textContent = parts.join(" · ");
  $("layer").replaceChildren(...Array.from({ length: c.n_layer }, (_, l) => new Option(`${l}`, `${l}`)));
  const heads = Array.from({ length: c.n_head }, (_, h) => new Option(`${h}`, `${h}`));
  $("head").replaceChildren(...heads, new Option("all heads", "all"));
  $("max_new_tokens").max = m.limits.max_new_tokens;
  // start from text this model can read: its own vocabulary, at most block_size tokens
  if (m.sample) {
    $("text").value = m.sample.text;
    $("prompt").value = m.sample.prompt;
  }
}

// After a text the model cannot read, show nothing rather than the previous text's weights.
function clearAnalysis() {
  state.tokens = [];
  state.ids = [];
  state.layers = new Map();
  state.images.clear();
  state.geometry = null;
  state.hover = null;
  state.pinned = null;
  renderTokens();
  renderDetail();
  const canvas = $("heatmap");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  $("grid").replaceChildren();
  $("heatmap-wrap").hidden = true;  // no title over an empty panel: the status says why
  $("map-title").textContent = "Attention weights";
  $("count").textContent = "";
}

// The weights of query q on keys 0..q; with every head on show, their mean (for the tokens).
function rowOf(layer, head, q) {
  const heads = state.layers.get(layer).heads;
  if (head !== "all") return heads[head][q];
  return heads[0][q].map((_, j) => heads.reduce((sum, h) => sum + h[q][j], 0) / heads.length);
}

// Why key j gets no weight from query i: later, or outside the layer's sliding window.
function maskedWhy(i, j) {
  const win = state.layers.get(state.layer).window;
  return j > i ? "later token" : `outside the sliding window of ${win}`;
}

// ------------------------------------------------------------------ analysis

// Run a new text (or generation's ids) for the layer chosen in the menu. The newest request
// wins: answers to older ones are dropped, and a layer switch meanwhile re-runs this one.
async function analyze(input, generatedFrom = null) {
  const seq = ++state.seq;
  state.pending = { input, generatedFrom };
  const layer = Number($("layer").value) || 0;
  setStatus($("status"), "running…");
  const t0 = performance.now();
  let data;
  try {
    data = await attention({ ...input, layers: [layer], norms: true });
  } catch (err) {
    if (seq === state.seq) {
      state.pending = null;
      clearAnalysis();
      setStatus($("status"), err.message, true);
    }
    return;
  }
  if (seq !== state.seq) return;
  const t1 = performance.now();
  state.pending = null;
  state.layer = layer;
  state.tokens = data.tokens;
  state.ids = data.tokens.map((t) => t.id);
  state.layers = new Map(data.layers.map((l) => [l.layer, l]));
  state.images.clear();
  state.generatedFrom = generatedFrom;
  state.hover = null;
  state.pinned = null;
  $("detail").hidden = true;  // until a token of the new text is hovered
  renderTokens();
  renderMap();
  renderDetail();
  state.timings.fetch = t1 - t0;
  state.timings.render = performance.now() - t1;
  setStatus($("status"), "");
  // a generation from a full context: its one token is past the view (never read)
  const seen = state.ids.length - generatedFrom;
  const generated = generatedFrom === null ? "" :
    seen > 0 ? ` · ${seen} generated (underlined)` : " · the generated token is past the context";
  $("count").textContent = `${state.ids.length} / ${state.model.config.block_size} tokens${generated}`;
}

// Switch layers only once the new layer's weights are here, so that every drawing reads
// the layer it names (the page may hover or redraw while the request is in flight).
async function showLayer(layer) {
  if (state.pending) {
    await analyze(state.pending.input, state.pending.generatedFrom);
    return;
  }
  if (!state.ids.length) {
    state.layer = layer;
    return;
  }
  // every switch, to a layer on hand too, makes the answers still on their way stale: the
  // last layer picked is the one drawn
  const seq = ++state.seq;
  if (!state.layers.has(layer)) {
    setStatus($("status"), "running…");
    try {
      const data = await attention({ ids: state.ids, layers: [layer], norms: true });
      if (seq !== state.seq) return;
      state.layers.set(layer, data.layers[0]);
    } catch (err) {
      if (seq === state.seq) setStatus($("status"), err.message, true);
      return;
    }
  }
  setStatus($("status"), "");
  state.layer = layer;
  renderMap();
  highlight();
}

// ------------------------------------------------------------------ tokens (head view)

function renderTokens() {
  const box = $("tokens");
  const frag = document.createDocumentFragment();
  state.chips = state.tokens.map((tok, i) => {
    const chip = document.createElement("span");
    chip.className = "tok";
    if (state.generatedFrom !== null && i >= state.generatedFrom) chip.classList.add("generated");
    chip.dataset.i = i;
    chip.tabIndex = 0;  // the keyboard reaches every token: focus shows, Enter or Space pins
    chip.textContent = shown(tok.text);
    frag.appendChild(chip);
    return chip;
  });
  box.replaceChildren(frag);
}

function query() {
  return state.pinned ?? state.hover;
}

// Colour every token by how much the query token attends to it; later tokens get 0.
function highlight() {
  const t0 = performance.now();
  const q = query();
  const row = q === null || !state.layers.has(state.layer) ? null : rowOf(state.layer, state.head, q);
  // the same colour scale as the heatmap: the weight itself, or relative to the row's
  // largest with "scale rows to max"; the numbers (title, table) are always the weights
  const top = row && $("rowscale").checked ? (Math.max(...row) || 1) : 1;
  const win = row && state.layers.get(state.layer).window;
  state.chips.forEach((chip, j) => {
    chip.classList.toggle("query", j === q);
    chip.classList.toggle("pinned", j === state.pinned);
    chip.classList.toggle("future", row !== null && !sees(q, j, win));
    if (row === null) {
      chip.style.background = "";
      chip.style.color = "";
      delete chip.dataset.weight;
      chip.title = `#${j}`;
    } else if (!sees(q, j, win)) {
      chip.style.background = "";
      chip.style.color = "";
      chip.dataset.weight = "0";
      chip.title = `#${j}: ${maskedWhy(q, j)}, masked (weight 0)`;
    } else {
      const t = row[j] / top;
      chip.style.background = colour(t);
      chip.style.color = inkFor(t);
      chip.dataset.weight = `${row[j]}`;
      chip.title = `#${j} ← #${q}: ${row[j].toFixed(5)}`;
    }
  });
  renderDetail();
  drawQuery();
  state.timings.highlight = performance.now() - t0;
}

function renderDetail() {
  const q = query();
  const box = $("detail");
  if (!state.layers.has(state.layer)) {
    box.hidden = true;
    return;
  }
  if (q === null) {
    // keep the panel's space: the pointer on its way from the tokens to a control below
    // would otherwise see that control jump up under it (a new text hides it)
    box.style.visibility = "hidden";
    return;
  }
  box.hidden = false;
  box.style.visibility = "";
  const data = state.layers.get(state.layer);
  const heads = state.head === "all" ? data.heads.map((_, h) => h) : [state.head];
  $("detail-title").textContent =
    `Token #${q} “${shown(state.tokens[q].text, 24)}” attends to (layer ${state.layer}, ` +
    (state.head === "all" ? "every head)" : `head ${state.head})`);
  const later = state.tokens.length - 1 - q;
  const note = later > 0
    ? `${later} later token${later > 1 ? "s" : ""} get weight 0 (causal mask; largest weight on any later token in this layer: ${data.future_max}).`
    : "The last token: every token is earlier or itself.";
  const outside = data.window ? Math.max(0, q + 1 - data.window) : 0;
  const windowNote = outside
    ? ` ${outside} earlier token${outside > 1 ? "s" : ""} fall outside this layer's sliding window of ${data.window}: masked, weight 0.`
    : "";
  const strongest = heads.map((h) => {
    const row = data.heads[h][q];
    const best = row.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    const list = best.map(([w, j]) => `#${j} “${shown(state.tokens[j].text)}” ${w.toFixed(3)}`).join(", ");
    return heads.length > 1 ? `head ${h}: ${list}` : list;
  });
  $("detail-note").textContent = `Strongest: ${strongest.join(" · ")}. ${note}${windowNote}`;
  let norms = "";
  if (data.norms && state.head !== "all") {
    // grouped-query attention: query head h reads key/value head h // (nh / nkv)
    const kv = Math.floor(state.head * data.norms.k.length / data.heads.length);
    norms = `Vector lengths of token #${q} in head ${state.head}: |q| ${data.norms.q[state.head][q]} · ` +
      `|k| ${data.norms.k[kv][q]} · |v| ${data.norms.v[kv][q]}`;
  }
  $("detail-norms").textContent = norms;

  const head = document.createElement("tr");
  ["#", "key token", ...heads.map((h) => `head ${h}`)].forEach((label) => {
    const th = document.createElement("th");
    th.textContent = label;
    head.appendChild(th);
  });
  $("weights").tHead.replaceChildren(head);
  const frag = document.createDocumentFragment();
  const rowscale = $("rowscale").checked;
  const rowMax = Object.fromEntries(
    heads.map((h) => [h, rowscale ? (Math.max(...data.heads[h][q]) || 1) : 1]));
  for (let j = 0; j <= q; j++) {
    const tr = document.createElement("tr");
    tr.dataset.j = j;
    const idx = document.createElement("td");
    idx.textContent = j;
    const tok = document.createElement("td");
    tok.className = "tokcell";
    tok.textContent = shown(state.tokens[j].text, 24);
    tr.append(idx, tok);
    for (const h of heads) {
      const w = data.heads[h][q][j];
      const td = document.createElement("td");
      td.className = "w";
      td.dataset.head = h;
      td.dataset.weight = `${w}`;
      td.textContent = sees(q, j, data.window) ? w.toFixed(5) : "masked";
      td.style.setProperty("--w", `${Math.round((w / rowMax[h]) * 100)}%`);
      tr.appendChild(td);
    }
    frag.appendChild(tr);
  }
  $("weights").tBodies[0].replaceChildren(frag);
}

// ------------------------------------------------------------------ heatmaps

function imageOf(layer, head) {
  const rowscale = $("rowscale").checked;
  const key = `${layer}/${head}/${rowscale}`;
  const data = state.layers.get(layer);
  if (!state.images.has(key)) state.images.set(key, headImage(data.heads[head], rowscale, data.window));
  return state.images.get(key);
}

function renderMap() {
  if (!state.layers.has(state.layer)) return;
  const all = state.head === "all";
  $("heatmap-wrap").hidden = all;
  $("grid").hidden = !all;
  $("ramp-max").textContent = rampEnd($("rowscale").checked);
  const win = state.layers.get(state.layer).window;
  $("masked-label").textContent = win
    ? `masked: later token or outside the sliding window of ${win}` : "later token (masked)";
  $("map-title").textContent = `Attention weights · layer ${state.layer} · ` +
    (all ? "every head (click one to open it)" : `head ${state.head}`);
  if (all) {
    buildGrid();
  } else {
    const room = Math.max(240, Math.min(760, $("map").clientWidth - 40));
    const labels = state.tokens.map((t) => shown(t.text));
    state.geometry = drawHeatmap($("heatmap"), imageOf(state.layer, state.head), labels, room);
  }
  drawQuery();
}

function buildGrid() {
  const n = state.layers.get(state.layer).heads.length;
  const frag = document.createDocumentFragment();
  state.minis = Array.from({ length: n }, (_, h) => {
    const fig = asButton(document.createElement("figure"), `open head ${h}`);
    fig.className = "mini";
    fig.dataset.head = h;
    fig.title = `open head ${h}`;
    const canvas = document.createElement("canvas");
    const cap = document.createElement("figcaption");
    cap.textContent = `head ${h}`;
    fig.append(canvas, cap);
    frag.appendChild(fig);
    return canvas;
  });
  $("grid").replaceChildren(frag);
}

// Outline the query row: a redraw of cached images, cheap enough for every hover.
function drawQuery() {
  const q = query();
  if (state.head !== "all") {
    if (state.geometry) drawCells($("heatmap"), state.geometry, imageOf(state.layer, state.head), q);
    return;
  }
  const px = Math.max(state.tokens.length, Math.min(200, Math.floor(($("map").clientWidth - 40) / 2) - 16));
  state.minis.forEach((canvas, h) => drawMini(canvas, imageOf(state.layer, h), px, q));
}

// ------------------------------------------------------------------ wiring

let pending = 0;
function scheduleHighlight() {
  if (!pending) pending = requestAnimationFrame(() => { pending = 0; highlight(); });
}

function wire() {
  let typing = 0;
  $("run").addEventListener("click", () => {
    clearTimeout(typing);
    analyze({ text: $("text").value });
  });
  $("text").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => analyze({ text: $("text").value }), 350);
  });
  $("layer").addEventListener("change", (e) => showLayer(Number(e.target.value)));
  $("head").addEventListener("change", (e) => {
    state.head = e.target.value === "all" ? "all" : Number(e.target.value);
    renderMap();
    highlight();
  });
  $("rowscale").addEventListener("change", () => { renderMap(); highlight(); });

  wireChips($("tokens"), ".tok", (i) => { state.hover = i; scheduleHighlight(); }, (i) => {
    state.pinned = state.pinned === i ? null : i;
    highlight();
  });

  const canvas = $("heatmap");
  const tip = $("tooltip");
  canvas.addEventListener("mousemove", (e) => {
    const cell = cellAt(canvas, state.geometry, e);
    if (!cell || !state.layers.has(state.layer)) { tip.hidden = true; return; }
    const { i, j } = cell;
    const w = sees(i, j, state.layers.get(state.layer).window)
      ? rowOf(state.layer, state.head, i)[j].toFixed(5) : `0 (${maskedWhy(i, j)}, masked)`;
    tip.textContent = `#${i} “${shown(state.tokens[i].text)}” → #${j} “${shown(state.tokens[j].text)}”: ${w}`;
    tip.hidden = false;
    placeTip(tip, $("heatmap-wrap"), e);
    if (state.hover !== i) { state.hover = i; scheduleHighlight(); }
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; state.hover = null; scheduleHighlight(); });
  canvas.addEventListener("click", (e) => {
    const cell = cellAt(canvas, state.geometry, e);
    if (cell) { state.pinned = state.pinned === cell.i ? null : cell.i; highlight(); }
  });
  $("grid").addEventListener("click", (e) => {
    const fig = e.target.closest(".mini");
    if (!fig) return;
    state.head = Number(fig.dataset.head);
    $("head").value = `${state.head}`;
    renderMap();
    highlight();
  });
  clickOnKeys($("grid"), ".mini");

  wireGeneration({
    show: (ids, generatedFrom) => analyze({ ids }, generatedFrom),
    blockSize: () => state.model.config.block_size,
  });
  window.addEventListener("resize", () => renderMap());
}

async function main() {
  wire();
  try {
    await loadModel();
  } catch (err) {
    setStatus($("status"), `cannot load the model: ${err.message}`, true);
    return;
  }
  await analyze({ text: $("text").value });
  document.body.dataset.ready = "1";
}

main();
