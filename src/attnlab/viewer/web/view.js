// attnlab.show()'s view: one self-contained attention view, for a notebook output or an
// HTML file. viewer/notebook.py inlines draw.js and this file into one classic script (no module, no
// network, no global but window.attnlabView) and calls mount(root, data) with the payload
// it built; several views on one page share nothing but that code.
//
// The payload (viewer/notebook.py writes it; all arrays are base64 of zlib-compressed bytes):
//   tokens[S]         labels of the key tokens; queries are the last T of them (off = S - T)
//   layers, heads     labels of the traced layers and heads; full: indices of the layers
//                     whose weights come at full resolution
//   weights           uint8 per cell of the full layers, by layer, head, query row: the
//                     weight as a fraction of its row's largest (0..254), 255 masked;
//                     tri: only keys 0..off+i of row i are stored (the rest are masked)
//   rowmax            float32 per (full layer, head, row): the row's largest weight
//   masks, layerMask  bit-packed (T, S) "may attend" masks and which one each layer uses
//   thumb             {T, S, codes}: every layer x head max-pooled to at most T x S cells,
//                     uint8 weight * 254, 255 where the whole block is masked
//   steps             {layer, head, scores, weights, scale}: one head's raw scores and
//                     weights, float32 (T, S), for the raw -> masked -> softmax view
import {
  cellAt, colour, drawCells, drawHeatmap, drawMini, inkFor, matrixImage, placeTip, scoreRGB,
  shown, weightRGB,
} from "./draw.js";

function bytesOf(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let k = 0; k < bin.length; k++) out[k] = bin.charCodeAt(k);
  return out;
}

async function inflate(b64) {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)");
  }
  const stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const floats = async (b64) => new Float32Array((await inflate(b64)).buffer);

// The decoded payload: what each cell holds, and nothing about the page.
async function decode(data) {
  const { T, S } = data;
  const off = S - T;
  const nh = data.heads.length;
  const codes = await inflate(data.weights);
  const rowmax = await floats(data.rowmax);
  const masks = await Promise.all(data.masks.map(inflate));
  const thumbCodes = await inflate(data.thumb.codes);
  const steps = data.steps && {
    ...data.steps, scores: await floats(data.steps.scores), weights: await floats(data.steps.weights),
  };
  const rowStart = (i) => (data.tri ? i * (off + 1) + (i * (i - 1)) / 2 : i * S);
  const headCells = rowStart(T);
  const fullOf = new Map(data.full.map((li, fi) => [li, fi]));
  const may = (li, i, j) => {
    const k = i * S + j;
    return (masks[data.layerMask[li]][k >> 3] >> (7 - (k & 7))) & 1;
  };
  // the stored code of a cell: 0..254 of its row's largest, 255 masked
  const code = (li, h, i, j) => {
    if (!may(li, i, j) || (data.tri && j > off + i)) return 255;
    return codes[(fullOf.get(li) * nh + h) * headCells + rowStart(i) + j];
  };
  const top = (li, h, i) => rowmax[(fullOf.get(li) * nh + h) * T + i];
  const weight = (li, h, i, j) => {
    const c = code(li, h, i, j);
    return c === 255 ? NaN : (c / 254) * top(li, h, i);
  };
  const thumbCode = (li, h, i, j) =>
    thumbCodes[((li * nh + h) * data.thumb.T + i) * data.thumb.S + j];
  return { ...data, off, nh, may, code, top, weight, thumbCode, steps, isFull: (li) => fullOf.has(li) };
}

// ------------------------------------------------------------------ one mounted view

export async function mount(root, data) {
  const app = root.querySelector(".alv-app");
  let m;
  try {
    m = await decode(data);
  } catch (err) {
    app.textContent = `attnlab view: cannot read its data (${err.message})`;
    app.classList.add("alv-error");
    return;
  }
  const state = {
    view: data.view, li: data.layer, head: data.head, hover: null, pinned: data.query,
    rowscale: data.rowscale, images: new Map(), geometry: null,
  };
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const labels = m.tokens.map((t) => shown(t));
  const layerName = (li) => (m.layers[li] === null ? "attention" : `layer ${m.layers[li]}`);

  // -------------------------------------------------------------- controls
  const bar = el("div", "alv-bar");
  const tabs = el("span", "alv-tabs");
  const names = { head: "head view", model: "model view", steps: "steps", text: "text" };
  for (const v of Object.keys(names)) {
    if (v === "steps" && !m.steps) continue;
    const b = el("button", "alv-tab", names[v]);
    b.type = "button";
    b.dataset.view = v;
    tabs.appendChild(b);
  }
  const layerSel = el("select", "alv-layer");
  m.full.forEach((li) => layerSel.appendChild(new Option(layerName(li), `${li}`)));
  const headSel = el("select", "alv-head");
  m.heads.forEach((h, k) => headSel.appendChild(new Option(`head ${h}`, `${k}`)));
  headSel.appendChild(new Option("all heads", "all"));
  const scale = el("input");
  scale.type = "checkbox";
  scale.checked = state.rowscale;
  const scaleLabel = el("label", "alv-check");
  scaleLabel.title = "colour each row relative to its largest weight (the numbers stay the weights)";
  scaleLabel.append(scale, " rows to max");
  bar.append(tabs, layerSel, headSel, scaleLabel, el("span", "alv-info", data.info));

  const note = el("div", "alv-note");
  const tokens = el("div", "alv-tokens");
  const detail = el("div", "alv-detail");
  const mapBox = el("div", "alv-map");
  const canvas = el("canvas", "alv-heatmap");
  const tip = el("div", "alv-tip");
  tip.hidden = true;
  mapBox.append(canvas, tip);
  const grid = el("div", "alv-grid");
  const stepsBox = el("div", "alv-steps");
  const legend = el("div", "alv-legend");
  legend.append(el("span", null, "0"), el("i", "alv-ramp"), el("span", null, "1"),
    el("i", "alv-masked"), el("span", null, "masked: may not attend"));
  app.replaceChildren(bar, note, tokens, detail, legend, mapBox, grid, stepsBox);

  const chips = m.tokens.map((t, p) => {
    const chip = el("span", "alv-tok", shown(t));
    chip.dataset.i = p;
    chip.tabIndex = 0;
    chip.title = `#${p}`;
    if (p < m.off) chip.classList.add("alv-cached");
    tokens.appendChild(chip);
    return chip;
  });

  // -------------------------------------------------------------- weights of the query
  const query = () => state.pinned ?? state.hover;
  const headsShown = () => (state.head === "all" ? m.heads.map((_, h) => h) : [state.head]);
  // weights of query row i over the keys (NaN where masked); all heads: their mean
  function rowOf(i) {
    const hs = headsShown();
    return Float64Array.from({ length: m.S }, (_, j) =>
      hs.reduce((sum, h) => sum + m.weight(state.li, h, i, j), 0) / hs.length);
  }
  const fmt = (w) => (Number.isNaN(w) ? "masked" : w.toFixed(4));
  // One cell as the table writes it: weights are stored as 8-bit steps of their row's
  // largest, so a stored 0 is "below half a step", not 0.
  function cellText(li, h, i, j) {
    const c = m.code(li, h, i, j);
    if (c === 255) return "masked";
    return c === 0 ? `< ${(m.top(li, h, i) / 508).toPrecision(2)}` : fmt(m.weight(li, h, i, j));
  }

  function highlight() {
    const p = query();
    const i = p === null ? -1 : p - m.off;
    const row = i >= 0 && m.isFull(state.li) ? rowOf(i) : null;
    let top = 1;
    if (row && state.rowscale) top = Math.max(...row.filter((w) => !Number.isNaN(w))) || 1;
    chips.forEach((chip, j) => {
      chip.classList.toggle("alv-query", j === p);
      chip.classList.toggle("alv-pinned", j === state.pinned);
      const masked = row !== null && Number.isNaN(row[j]);
      chip.classList.toggle("alv-masked", masked);
      if (row === null || masked) {
        chip.style.background = "";
        chip.style.color = "";
        delete chip.dataset.weight;
        chip.title = masked ? `#${j}: masked (#${p} may not attend to it)` : `#${j}`;
      } else {
        const t = row[j] / top;
        chip.style.background = colour(t);
        chip.style.color = inkFor(t);
        chip.dataset.weight = `${row[j]}`;
        const hs = headsShown();  // one head: as the table writes it; all: their mean
        chip.title = `#${p} → #${j}: ${hs.length === 1 ? cellText(state.li, hs[0], i, j) : fmt(row[j])}`;
      }
    });
    renderDetail(p, i);
    if (state.view === "head") drawQuery();
  }

  function renderDetail(p, i) {
    if (state.view !== "head" || !m.isFull(state.li)) {
      detail.hidden = true;
      return;
    }
    if (i < 0) {  // keep its space: the map below would jump under the pointer
      detail.style.visibility = "hidden";
      return;
    }
    detail.hidden = false;
    detail.style.visibility = "";
    const hs = headsShown();
    const rows = hs.map((h) => Float64Array.from({ length: m.S }, (_, j) => m.weight(state.li, h, i, j)));
    const mean = Float64Array.from({ length: m.S }, (_, j) => rows.reduce((s, r) => s + r[j], 0) / rows.length);
    let keys = [...Array(m.S).keys()].filter((j) => !Number.isNaN(mean[j]));
    const masked = m.S - keys.length;
    const many = keys.length > 48;
    if (many) keys = keys.sort((a, b) => mean[b] - mean[a]).slice(0, 16).sort((a, b) => a - b);
    const title = el("div", "alv-title", `#${p} “${shown(m.tokens[p], 24)}” attends to (${layerName(state.li)}, ` +
      (state.head === "all" ? "every head)" : `head ${m.heads[state.head]})`));
    const sub = el("div", "alv-muted", (many ? `the 16 largest of ${m.S - masked} weights · ` : "") +
      `${masked} key${masked === 1 ? "" : "s"} masked` +
      (data.precision ? ` · ${data.precision}` : ""));
    const table = el("table", "alv-weights");
    const head = el("tr");
    ["#", "key", ...hs.map((h) => `head ${m.heads[h]}`)].forEach((t) => head.appendChild(el("th", null, t)));
    table.appendChild(head);
    for (const j of keys) {
      const tr = el("tr");
      tr.dataset.j = j;
      tr.append(el("td", "alv-idx", `${j}`), el("td", "alv-key", shown(m.tokens[j], 24)));
      rows.forEach((r, k) => {
        const td = el("td", "w", cellText(state.li, hs[k], i, j));
        td.dataset.head = m.heads[hs[k]];
        td.dataset.weight = `${r[j]}`;
        const t = state.rowscale ? r[j] / (m.top(state.li, hs[k], i) || 1) : r[j];
        td.style.setProperty("--w", `${Math.round(t * 100)}%`);
        tr.appendChild(td);
      });
      table.appendChild(tr);
    }
    const wrap = el("div", "alv-table");
    wrap.appendChild(table);
    detail.replaceChildren(title, sub, wrap);
  }

  // -------------------------------------------------------------- images
  function fullImage(li, h) {
    const key = `f${li}/${h}/${state.rowscale}`;
    if (!state.images.has(key)) {
      state.images.set(key, matrixImage(m.T, m.S, (i, j) => {
        const c = m.code(li, h, i, j);
        if (c === 255) return weightRGB(NaN);
        return weightRGB(state.rowscale ? c / 254 : (c / 254) * m.top(li, h, i));
      }));
    }
    return state.images.get(key);
  }

  function thumbImage(li, h) {
    const key = `t${li}/${h}/${state.rowscale}`;
    if (!state.images.has(key)) {
      const { T, S } = m.thumb;
      const tops = Array.from({ length: T }, (_, i) => {
        let best = 0;
        for (let j = 0; j < S; j++) {
          const c = m.thumbCode(li, h, i, j);
          if (c !== 255 && c > best) best = c;
        }
        return best || 1;
      });
      state.images.set(key, matrixImage(T, S, (i, j) => {
        const c = m.thumbCode(li, h, i, j);
        return weightRGB(c === 255 ? NaN : c / (state.rowscale ? tops[i] : 254));
      }));
    }
    return state.images.get(key);
  }

  const room = () => Math.max(260, Math.min(820, (app.clientWidth || 820) - 20));

  function renderMap() {
    const single = state.head !== "all";
    mapBox.hidden = !single;
    grid.hidden = single;
    if (single) {
      state.geometry = drawHeatmap(canvas, fullImage(state.li, state.head), labels, room(),
        labels.slice(m.off), m.off);
    } else {
      minis(m.heads.map((h, k) => [state.li, k, `head ${h}`]), fullImage, 150);
    }
    drawQuery();
  }

  // small multiples: one figure per [layer index, head index, caption]
  function minis(items, imageOf, px, rowLabel) {
    const frag = document.createDocumentFragment();
    let line = null;
    for (const [li, h, cap] of items) {
      if (rowLabel && h === 0) {
        line = el("div", "alv-gridrow");
        line.appendChild(el("div", "alv-rowlabel", rowLabel(li)));
        frag.appendChild(line);
      }
      const fig = el("figure", "alv-mini");
      fig.dataset.layer = li;
      fig.dataset.head = h;
      fig.title = m.isFull(li) ? `open ${layerName(li)}, head ${m.heads[h]}` : `${layerName(li)} is only in the overview`;
      const c = el("canvas");
      drawMini(c, imageOf(li, h), px, null);
      fig.append(c, el("figcaption", null, cap));
      (line || frag).appendChild(fig);
    }
    grid.replaceChildren(frag);
  }

  function drawQuery() {
    const p = query();
    const i = p === null ? null : p - m.off;
    if (state.head !== "all" && state.geometry) {
      let last = i;
      if (i !== null && i >= 0) for (let j = m.S - 1; j >= 0; j--) if (m.may(state.li, i, j)) { last = j; break; }
      drawCells(canvas, state.geometry, fullImage(state.li, state.head), i !== null && i >= 0 ? i : null, last);
    } else if (state.head === "all") {
      grid.querySelectorAll("canvas").forEach((c, h) => drawMini(c, fullImage(state.li, h), 150, i !== null && i >= 0 ? i : null));
    }
  }

  // -------------------------------------------------------------- steps
  function renderSteps() {
    const s = m.steps;
    const li = m.layers.indexOf(s.layer);
    const at = (i, j) => i * m.S + j;
    let lim = 0;
    for (let k = 0; k < s.scores.length; k++) lim = Math.max(lim, Math.abs(s.scores[k]));
    const masked = (i, j) => !m.may(li, i, j);
    const panels = [
      ["1 · raw scores q·kᵀ", (i, j) => scoreRGB(s.scores[at(i, j)], lim), (i, j) => s.scores[at(i, j)].toFixed(4)],
      ["2 · masked: −∞ where a query may not attend", (i, j) => scoreRGB(masked(i, j) ? -Infinity : s.scores[at(i, j)], lim),
        (i, j) => (masked(i, j) ? "−inf" : s.scores[at(i, j)].toFixed(4))],
      [`3 · softmax(masked${s.scale === null ? " × scale" : ` × ${s.scale.toPrecision(4)}`}): the weights`,
        (i, j) => weightRGB(masked(i, j) ? NaN : s.weights[at(i, j)]),
        (i, j) => (masked(i, j) ? "masked" : s.weights[at(i, j)].toFixed(4))],
    ];
    const readout = el("div", "alv-muted alv-readout", "hover a cell");
    const figs = panels.map(([title, rgb, text], k) => {
      const fig = el("figure", "alv-step");
      const c = el("canvas");
      const g = drawHeatmap(c, matrixImage(m.T, m.S, rgb), labels,
        Math.max(200, Math.floor(room() / 3) - 8), labels.slice(m.off), m.off);
      c.addEventListener("mousemove", (e) => {
        const cell = cellAt(c, g, e);
        readout.textContent = cell ? `#${cell.i + m.off} → #${cell.j}: ` + panels.map(
          ([, , f]) => f(cell.i, cell.j)).join(" → ") : "hover a cell";
      });
      fig.append(el("figcaption", null, title), c);
      if (m.T <= 12 && m.S <= 12) fig.appendChild(numbers(text, k));
      return fig;
    });
    const row = el("div", "alv-steprow");
    row.append(...figs);
    stepsBox.replaceChildren(el("div", "alv-title",
      `${layerName(li)}, head ${s.head}: raw scores → masked → softmax`), row, readout);
  }

  function numbers(text, k) {
    const table = el("table", "alv-matrix");
    table.dataset.step = k + 1;
    for (let i = 0; i < m.T; i++) {
      const tr = el("tr");
      for (let j = 0; j < m.S; j++) tr.appendChild(el("td", null, text(i, j)));
      table.appendChild(tr);
    }
    return table;
  }

  // -------------------------------------------------------------- views
  function render() {
    const v = state.view;
    app.dataset.view = v;
    tabs.querySelectorAll("button").forEach((b) => b.classList.toggle("alv-on", b.dataset.view === v));
    layerSel.value = `${state.li}`;
    headSel.value = `${state.head}`;
    layerSel.hidden = headSel.hidden = v === "model" || v === "steps";
    tokens.hidden = !(v === "head" || v === "text");
    tokens.classList.toggle("alv-flow", v === "text");
    legend.hidden = v === "steps";
    scaleLabel.hidden = v === "steps";  // the steps draw scores and weights as they are
    mapBox.hidden = grid.hidden = stepsBox.hidden = true;
    note.textContent = "";
    if (v === "head") renderMap();
    if (v === "model") {
      grid.hidden = false;
      const items = [];
      m.layers.forEach((_, li) => m.heads.forEach((h, k) => items.push([li, k, `${h}`])));
      const px = Math.max(48, Math.min(96, Math.floor(room() / (m.heads.length + 1)) - 6));
      minis(items, thumbImage, px, layerName);
      note.textContent = "every layer × head" + (m.thumb.T < m.T ? ` (max-pooled to ${m.thumb.T} cells a side)` : "") +
        "; click one to open it";
    }
    if (v === "steps") {
      stepsBox.hidden = false;
      renderSteps();
    }
    if (v === "text") {
      note.textContent = `${layerName(state.li)}, ` + (state.head === "all" ? "mean of every head" : `head ${m.heads[state.head]}`) +
        ": each token coloured by how much the chosen query (outlined) attends to it; hover or click a token";
    }
    highlight();
  }

  // -------------------------------------------------------------- wiring
  tabs.addEventListener("click", (e) => {
    const b = e.target.closest("button");
    if (b) { state.view = b.dataset.view; render(); }
  });
  layerSel.addEventListener("change", () => { state.li = Number(layerSel.value); render(); });
  headSel.addEventListener("change", () => {
    state.head = headSel.value === "all" ? "all" : Number(headSel.value);
    render();
  });
  scale.addEventListener("change", () => { state.rowscale = scale.checked; render(); });
  tokens.addEventListener("mouseover", (e) => {
    const chip = e.target.closest(".alv-tok");
    if (chip && state.hover !== Number(chip.dataset.i)) { state.hover = Number(chip.dataset.i); highlight(); }
  });
  tokens.addEventListener("mouseleave", () => { state.hover = null; highlight(); });
  tokens.addEventListener("focusin", (e) => {  // the keyboard: focus shows, Enter/Space pins
    const chip = e.target.closest(".alv-tok");
    if (chip) { state.hover = Number(chip.dataset.i); highlight(); }
  });
  tokens.addEventListener("focusout", () => { state.hover = null; highlight(); });
  tokens.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && e.target.closest(".alv-tok")) {
      e.preventDefault();
      e.target.click();
    }
  });
  tokens.addEventListener("click", (e) => {
    const chip = e.target.closest(".alv-tok");
    if (!chip) return;
    const p = Number(chip.dataset.i);
    state.pinned = state.pinned === p ? null : p;
    highlight();
  });
  canvas.addEventListener("mousemove", (e) => {
    const cell = cellAt(canvas, state.geometry, e);
    if (!cell) { tip.hidden = true; return; }
    const p = cell.i + m.off;
    tip.textContent = `#${p} “${labels[p]}” → #${cell.j} “${labels[cell.j]}”: ` +
      cellText(state.li, state.head, cell.i, cell.j);
    tip.hidden = false;
    placeTip(tip, mapBox, e);
    if (state.hover !== p) { state.hover = p; highlight(); }
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; state.hover = null; highlight(); });
  canvas.addEventListener("click", (e) => {
    const cell = cellAt(canvas, state.geometry, e);
    if (cell) { const p = cell.i + m.off; state.pinned = state.pinned === p ? null : p; highlight(); }
  });
  grid.addEventListener("click", (e) => {
    const fig = e.target.closest(".alv-mini");
    if (!fig) return;
    const li = Number(fig.dataset.layer);
    if (!m.isFull(li)) {
      note.textContent = `${layerName(li)} is in this view only as the overview (the size budget); ` +
        `show(..., layer=${m.layers[li]}) embeds it in full`;
      return;
    }
    state.li = li;
    state.head = Number(fig.dataset.head);
    state.view = "head";
    render();
  });

  render();
  root.dataset.ready = "1";
}
