// attnlab attention viewer: talks to the JSON API of attnlab/server.py and draws on canvas.
// No build step and no dependencies, so the page works offline from the installed package.
// Weights arrive as the lower triangle (row i: keys 0..i); later keys are masked to 0.
"use strict";

const $ = (id) => document.getElementById(id);

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
  seq: 0,             // drops answers to requests that a newer one replaced
  chips: [],
  geometry: null,     // where the heatmap cells are, for hit testing
  timings: {},        // milliseconds of the last fetch / render / highlight (read by tests)
};
window.attnlab = state;

// ------------------------------------------------------------------ colours

// A white-to-navy ramp (ColorBrewer "Blues"), as a 256-entry lookup table.
const STOPS = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
const LUT = Array.from({ length: 256 }, (_, n) => {
  const x = (n / 255) * (STOPS.length - 1);
  const k = Math.min(Math.floor(x), STOPS.length - 2);
  const f = x - k;
  return STOPS[k].map((c, m) => Math.round(c + f * (STOPS[k + 1][m] - c)));
});
const FUTURE = [228, 228, 234];
const lut = (t) => LUT[Math.max(0, Math.min(255, Math.round(t * 255)))];
const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
const inkFor = (t) => (t > 0.55 ? "#fff" : "#111");

// A token as text a reader can see: whitespace made visible, long pieces cut.
function shown(piece, max = 12) {
  let s = piece.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  if (s.trim() === "") s = s.replace(/ /g, "␣");
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

// ------------------------------------------------------------------ API

async function api(path, body) {
  const res = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(await errorText(res));
  return res.json();
}

async function errorText(res) {
  try {
    const data = await res.json();
    return data.error || `HTTP ${res.status}`;
  } catch (_) {
    return `HTTP ${res.status}`;
  }
}

function setStatus(el, text, isError = false) {
  el.textContent = text;
  el.classList.toggle("error", isError);
}

// ------------------------------------------------------------------ model and controls

function fmtCount(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : `${n}`;
}

async function loadModel() {
  const m = await api("/api/model");
  state.model = m;
  const c = m.config;
  const parts = [
    `${c.n_layer} layers × ${c.n_head} heads`, `${c.n_embd} dims`, `block ${c.block_size}`,
    `${fmtCount(m.n_params)} params`, `${m.tokenizer.kind} tokenizer (${m.tokenizer.vocab_size})`,
  ];
  const meta = m.meta || {};
  if (meta.step !== undefined) parts.push(`trained ${meta.step} steps`);
  const loss = meta.val_loss ?? meta.loss;
  if (typeof loss === "number") parts.push(`loss ${loss.toFixed(3)}`);
  $("model-info").textContent = parts.join(" · ");
  $("layer").replaceChildren(...Array.from({ length: c.n_layer }, (_, l) => new Option(`${l}`, `${l}`)));
  const heads = Array.from({ length: c.n_head }, (_, h) => new Option(`${h}`, `${h}`));
  $("head").replaceChildren(...heads, new Option("all heads", "all"));
  $("max_new_tokens").max = m.limits.max_new_tokens;
}

function rowsOf(layer, head) {
  const data = state.layers.get(layer);
  if (head !== "all") return data.heads[head];
  // mean over heads, for the token highlight when every head is on show
  const n = data.heads.length;
  return data.heads[0].map((row, i) => row.map((_, j) => {
    let s = 0;
    for (let h = 0; h < n; h++) s += data.heads[h][i][j];
    return s / n;
  }));
}

// ------------------------------------------------------------------ analysis

async function analyze(input, generatedFrom = null) {
  const seq = ++state.seq;
  setStatus($("status"), "running…");
  const t0 = performance.now();
  let data;
  try {
    data = await api("/api/attention", { ...input, layers: [state.layer], norms: true });
  } catch (err) {
    if (seq === state.seq) setStatus($("status"), err.message, true);
    return;
  }
  if (seq !== state.seq) return;
  const t1 = performance.now();
  state.tokens = data.tokens;
  state.ids = data.tokens.map((t) => t.id);
  state.layers = new Map(data.layers.map((l) => [l.layer, l]));
  state.generatedFrom = generatedFrom;
  state.hover = null;
  state.pinned = null;
  renderTokens();
  renderMap();
  renderDetail();
  state.timings.fetch = t1 - t0;
  state.timings.render = performance.now() - t1;
  setStatus($("status"), "");
  const generated = generatedFrom === null ? "" : ` · ${state.ids.length - generatedFrom} generated (underlined)`;
  $("count").textContent = `${state.ids.length} / ${state.model.config.block_size} tokens${generated}`;
}

// Switch layers only once the new layer's weights are here, so that every drawing reads
// the layer it names (the page may hover or redraw while the request is in flight).
async function showLayer(layer) {
  if (!state.ids.length) {
    state.layer = layer;
    return;
  }
  if (!state.layers.has(layer)) {
    const seq = ++state.seq;
    setStatus($("status"), "running…");
    try {
      const data = await api("/api/attention", { ids: state.ids, layers: [layer], norms: true });
      if (seq !== state.seq) return;
      state.layers.set(layer, data.layers[0]);
      setStatus($("status"), "");
    } catch (err) {
      setStatus($("status"), err.message, true);
      return;
    }
  }
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
  const rows = q === null || !state.layers.has(state.layer) ? null : rowsOf(state.layer, state.head);
  const row = rows ? rows[q] : null;
  // colours are relative to the row's largest weight, so a long row is still readable;
  // the numbers (title, table, data-weight) are the weights themselves
  const top = row ? (Math.max(...row) || 1) : 1;
  state.chips.forEach((chip, j) => {
    chip.classList.toggle("query", j === q);
    chip.classList.toggle("pinned", j === state.pinned);
    chip.classList.toggle("future", row !== null && j > q);
    if (row === null) {
      chip.style.background = "";
      chip.style.color = "";
      delete chip.dataset.weight;
      chip.title = `#${j}`;
    } else if (j > q) {
      chip.style.background = "";
      chip.style.color = "";
      chip.dataset.weight = "0";
      chip.title = `#${j}: later token, masked (weight 0)`;
    } else {
      const t = row[j] / top;
      chip.style.background = css(lut(t));
      chip.style.color = inkFor(t);
      chip.dataset.weight = `${row[j]}`;
      chip.title = `#${j} ← #${q}: ${row[j].toFixed(5)}`;
    }
  });
  renderDetail();
  drawOverlay();
  state.timings.highlight = performance.now() - t0;
}

function renderDetail() {
  const q = query();
  const box = $("detail");
  if (q === null || !state.layers.has(state.layer)) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const data = state.layers.get(state.layer);
  const heads = state.head === "all" ? data.heads.map((_, h) => h) : [state.head];
  $("detail-title").textContent =
    `Token #${q} “${shown(state.tokens[q].text, 24)}” attends to (layer ${state.layer}, ` +
    (state.head === "all" ? "every head)" : `head ${state.head})`);
  const later = state.tokens.length - 1 - q;
  const note = later > 0
    ? `${later} later token${later > 1 ? "s" : ""} get weight 0 (causal mask; largest weight on any later token in this layer: ${data.future_max}).`
    : "The last token: every token is earlier or itself.";
  const strongest = heads.map((h) => {
    const row = data.heads[h][q];
    const best = row.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    const list = best.map(([w, j]) => `#${j} “${shown(state.tokens[j].text)}” ${w.toFixed(3)}`).join(", ");
    return heads.length > 1 ? `head ${h}: ${list}` : list;
  });
  $("detail-note").textContent = `Strongest: ${strongest.join(" · ")}. ${note}`;
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
  const rowMax = Object.fromEntries(heads.map((h) => [h, Math.max(...data.heads[h][q]) || 1]));
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
      td.textContent = w.toFixed(5);
      td.style.setProperty("--w", `${Math.round((w / rowMax[h]) * 100)}%`);
      tr.appendChild(td);
    }
    frag.appendChild(tr);
  }
  $("weights").tBodies[0].replaceChildren(frag);
}

// ------------------------------------------------------------------ heatmaps

// A T x T image of one head: one pixel per cell, scaled up later without smoothing.
function cellImage(rows, rowscale) {
  const T = rows.length;
  const img = new ImageData(T, T);
  const px = img.data;
  for (let i = 0; i < T; i++) {
    const row = rows[i];
    const top = rowscale ? (Math.max(...row) || 1) : 1;
    for (let j = 0; j < T; j++) {
      const rgb = j <= i ? lut(row[j] / top) : FUTURE;
      const o = 4 * (i * T + j);
      px[o] = rgb[0];
      px[o + 1] = rgb[1];
      px[o + 2] = rgb[2];
      px[o + 3] = 255;
    }
  }
  const off = document.createElement("canvas");
  off.width = off.height = T;
  off.getContext("2d").putImageData(img, 0, 0);
  return off;
}

function renderMap() {
  if (!state.layers.has(state.layer)) return;
  const all = state.head === "all";
  $("heatmap-wrap").hidden = all;
  $("grid").hidden = !all;
  $("ramp-max").textContent = $("rowscale").checked ? "row max" : "1";
  $("map-title").textContent = `Attention weights · layer ${state.layer} · ` +
    (all ? "every head (click one to open it)" : `head ${state.head}`);
  if (all) drawGrid();
  else drawHeatmap();
}

function drawHeatmap() {
  const rows = rowsOf(state.layer, state.head);
  const T = rows.length;
  const canvas = $("heatmap");
  const room = Math.max(240, Math.min(760, $("map").clientWidth - 40));
  // whole pixels while labels fit; below 4 px a fractional cell uses the room better
  const fit = (room - 70) / T;
  const cell = fit >= 4 ? Math.min(28, Math.floor(fit)) : Math.max(1, fit);
  const labels = cell >= 9;
  const font = `${Math.min(12, cell - 1)}px ui-monospace, monospace`;
  const ctx0 = canvas.getContext("2d");
  ctx0.font = font;
  const margin = labels
    ? Math.min(90, 8 + Math.max(...state.tokens.map((t) => ctx0.measureText(shown(t.text)).width)))
    : 34;
  const size = margin + T * cell;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round((size + 4) * dpr);
  canvas.height = Math.round((size + 4) * dpr);
  canvas.style.width = `${size + 4}px`;
  canvas.style.height = `${size + 4}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.imageSmoothingEnabled = false;
  const image = cellImage(rows, $("rowscale").checked);
  ctx.drawImage(image, margin, margin, T * cell, T * cell);
  ctx.fillStyle = "#333";
  ctx.font = font;
  if (labels) {
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    state.tokens.forEach((t, i) => ctx.fillText(shown(t.text), margin - 4, margin + (i + 0.5) * cell));
    ctx.save();
    ctx.textAlign = "left";
    state.tokens.forEach((t, j) => {
      ctx.setTransform(dpr, 0, 0, dpr, dpr * (margin + (j + 0.5) * cell), dpr * (margin - 4));
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(shown(t.text), 0, 0);
    });
    ctx.restore();
  } else {
    // too small for words: index ticks every `step` tokens
    const step = [1, 2, 5, 10, 20, 25, 50, 100, 200].find((s) => s * cell >= 28) || 500;
    ctx.font = "10px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    for (let i = 0; i < T; i += step) {
      ctx.textAlign = "right";
      ctx.fillText(`${i}`, margin - 4, margin + (i + 0.5) * cell);
      ctx.textAlign = "center";
      ctx.fillText(`${i}`, margin + (i + 0.5) * cell, margin - 8);
    }
  }
  state.geometry = { margin, cell, T, image, dpr, size };
  drawOverlay();
}

// Redraw the cells and outline the query row, without recomputing labels or pixels.
function drawOverlay() {
  const g = state.geometry;
  if (!g || state.head === "all") {
    if (state.head === "all") drawGrid();
    return;
  }
  const ctx = $("heatmap").getContext("2d");
  ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(g.image, g.margin, g.margin, g.T * g.cell, g.T * g.cell);
  const q = query();
  if (q !== null && q < g.T) {
    ctx.strokeStyle = "#e4572e";
    ctx.lineWidth = 2;
    ctx.strokeRect(g.margin - 1, g.margin + q * g.cell - 1, (q + 1) * g.cell + 2, g.cell + 2);
  }
}

function drawGrid() {
  const data = state.layers.get(state.layer);
  if (!data) return;
  const grid = $("grid");
  const T = state.tokens.length;
  const q = query();
  const px = Math.max(T, Math.min(200, Math.floor(($("map").clientWidth - 40) / 2) - 16));
  const frag = document.createDocumentFragment();
  data.heads.forEach((rows, h) => {
    const fig = document.createElement("figure");
    fig.className = "mini";
    fig.dataset.head = h;
    fig.title = `open head ${h}`;
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = px;
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(cellImage(rows, $("rowscale").checked), 0, 0, px, px);
    if (q !== null) {
      ctx.strokeStyle = "#e4572e";
      ctx.lineWidth = 2;
      ctx.strokeRect(0, (q * px) / T, ((q + 1) * px) / T, px / T);
    }
    const cap = document.createElement("figcaption");
    cap.textContent = `head ${h}`;
    fig.append(canvas, cap);
    frag.appendChild(fig);
  });
  grid.replaceChildren(frag);
}

function cellAt(event) {
  const g = state.geometry;
  if (!g) return null;
  const rect = $("heatmap").getBoundingClientRect();
  const i = Math.floor((event.clientY - rect.top - g.margin) / g.cell);
  const j = Math.floor((event.clientX - rect.left - g.margin) / g.cell);
  return i >= 0 && j >= 0 && i < g.T && j < g.T ? { i, j } : null;
}

// ------------------------------------------------------------------ generation

let generation = null; // AbortController of the running generation

async function generate() {
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  const prompt = $("prompt").value;
  const body = {
    text: prompt, max_new_tokens: num("max_new_tokens") ?? 40, temperature: num("temperature") ?? 1,
    top_k: num("top_k"), top_p: num("top_p"), seed: num("seed"),
  };
  const out = $("output");
  out.querySelector(".prompt-text").textContent = prompt;
  const newText = out.querySelector(".new-text");
  newText.textContent = "";
  generation = new AbortController();
  $("gen").disabled = true;
  $("stop").disabled = false;
  setStatus($("gen-status"), "generating…");
  const t0 = performance.now();
  let count = 0;
  let done = null;
  try {
    const res = await fetch("/api/generate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: generation.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (event.type === "token") {
          newText.textContent += event.data.text;
          if (event.data.id !== null) count += 1;
          const secs = (performance.now() - t0) / 1000;
          setStatus($("gen-status"), `${count} tokens · ${(count / secs).toFixed(1)} tokens/s`);
        } else if (event.type === "done") {
          done = event.data;
        } else if (event.type === "error") {
          throw new Error(event.data.error);
        }
      }
    }
  } catch (err) {
    if (err.name === "AbortError") setStatus($("gen-status"), `stopped after ${count} tokens`);
    else setStatus($("gen-status"), err.message, true);
  } finally {
    $("gen").disabled = false;
    $("stop").disabled = true;
    generation = null;
  }
  const full = prompt + newText.textContent;
  if (done) {
    const why = { eot: "end of text", block_size: "context full", max_new_tokens: "max tokens" };
    setStatus($("gen-status"), `${done.new_tokens} tokens (${why[done.reason] || done.reason}) · its attention is shown above`);
    $("text").value = full;
    await analyze({ ids: done.ids }, done.ids.length - done.new_tokens);
  } else if (count > 0) {
    $("text").value = full;
    await analyze({ text: full });
  }
}

function parseEvent(block) {
  let type = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  return { type, data: data ? JSON.parse(data) : null };
}

// ------------------------------------------------------------------ wiring

let pending = 0;
function scheduleHighlight() {
  if (!pending) pending = requestAnimationFrame(() => { pending = 0; highlight(); });
}

function wire() {
  let typing = 0;
  $("run").addEventListener("click", () => analyze({ text: $("text").value }));
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

  const tokens = $("tokens");
  tokens.addEventListener("mouseover", (e) => {
    const chip = e.target.closest(".tok");
    if (chip) { state.hover = Number(chip.dataset.i); scheduleHighlight(); }
  });
  tokens.addEventListener("mouseleave", () => { state.hover = null; scheduleHighlight(); });
  tokens.addEventListener("click", (e) => {
    const chip = e.target.closest(".tok");
    if (!chip) return;
    const i = Number(chip.dataset.i);
    state.pinned = state.pinned === i ? null : i;
    highlight();
  });

  const canvas = $("heatmap");
  const tip = $("tooltip");
  canvas.addEventListener("mousemove", (e) => {
    const cell = cellAt(e);
    if (!cell || !state.layers.has(state.layer)) { tip.hidden = true; return; }
    const { i, j } = cell;
    const rows = rowsOf(state.layer, state.head);
    const w = j <= i ? rows[i][j].toFixed(5) : "0 (later token, masked)";
    tip.textContent = `#${i} “${shown(state.tokens[i].text)}” → #${j} “${shown(state.tokens[j].text)}”: ${w}`;
    tip.hidden = false;
    // below right of the pointer, or flipped where that would run out of the visible area
    const wrap = $("heatmap-wrap");
    const right = wrap.scrollLeft + wrap.clientWidth;
    const bottom = wrap.scrollTop + wrap.clientHeight;
    const x = e.offsetX + 14 + tip.offsetWidth > right ? e.offsetX - tip.offsetWidth - 8 : e.offsetX + 14;
    const y = e.offsetY + 14 + tip.offsetHeight > bottom ? e.offsetY - tip.offsetHeight - 8 : e.offsetY + 14;
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${Math.max(0, y)}px`;
    if (state.hover !== i) { state.hover = i; scheduleHighlight(); }
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; state.hover = null; scheduleHighlight(); });
  canvas.addEventListener("click", (e) => {
    const cell = cellAt(e);
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

  $("gen").addEventListener("click", generate);
  $("stop").addEventListener("click", () => generation && generation.abort());
  window.addEventListener("resize", () => renderMap());
}

async function main() {
  wire();
  try {
    await loadModel();
  } catch (err) {
    setStatus($("status"), `cannot reach the server: ${err.message}`, true);
    return;
  }
  await analyze({ text: $("text").value });
  document.body.dataset.ready = "1";
}

main();
