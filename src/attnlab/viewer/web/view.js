// attnlab.show()'s view: one self-contained attention view, for a notebook output or an
// HTML file. viewer/fragment.py inlines draw.js, chips.js, view_data.js, routing.js (a mixture
// of experts' routing tab, as the served page's routing panel draws it) and this file into one
// classic script (no module, no network, no global but window.attnlabView) and calls
// mount(root, data) with the payload viewer/notebook.py built; several views on one page
// share nothing but that code. The payload's format and its decoding are view_data.js's.

import {
  cellAt, colour, drawCells, drawHeatmap, drawMini, inkFor, matrixImage, placeTip, rampEnd,
  scoreRGB, shown, weightRGB,
} from "./draw.js";
import { asButton, clickOnKeys, wireChips } from "./chips.js";
import { Routing } from "./routing.js";
import { decode } from "./view_data.js";

// ------------------------------------------------------------------ one mounted view

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const fmt = (w) => (Number.isNaN(w) ? "masked" : w.toFixed(4));

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
  new View(app, m).render();
  root.dataset.ready = "1";
}

// One view's page: its elements (ui), what is on show (state) and the decoded payload (m).
class View {
  constructor(app, m) {
    this.app = app;
    this.m = m;
    this.state = {
      view: m.view, li: m.layer, head: m.head, hover: null, pinned: m.query,
      rowscale: m.rowscale, images: new Map(), geometry: null,
    };
    this.labels = m.tokens.map((t) => shown(t));
    this.ui = this.build();
    this.wireControls();
    this.wireTokens();
    this.wireMap();
  }

  layerName(li) {
    return this.m.layers[li] === null ? "attention" : `layer ${this.m.layers[li]}`;
  }

  // ------------------------------------------------------------ elements
  build() {
    const { m, state } = this;
    const bar = el("div", "alv-bar");
    const tabs = el("span", "alv-tabs");
    const names = { head: "head view", model: "model view", steps: "steps", text: "text", routing: "routing" };
    for (const v of Object.keys(names)) {
      if ((v === "steps" && !m.steps) || (v === "routing" && !m.routing)) continue;
      const b = el("button", "alv-tab", names[v]);
      b.type = "button";
      b.dataset.view = v;
      tabs.appendChild(b);
    }
    const layerSel = el("select", "alv-layer");
    m.full.forEach((li) => layerSel.appendChild(new Option(this.layerName(li), `${li}`)));
    const headSel = el("select", "alv-head");
    m.heads.forEach((h, k) => headSel.appendChild(new Option(`head ${h}`, `${k}`)));
    headSel.appendChild(new Option("all heads", "all"));
    const scale = el("input");
    scale.type = "checkbox";
    scale.checked = state.rowscale;
    const scaleLabel = el("label", "alv-check");
    scaleLabel.title = "colour each row relative to its largest weight (the numbers stay the weights)";
    scaleLabel.append(scale, " rows to max");
    bar.append(tabs, layerSel, headSel, scaleLabel, el("span", "alv-info", m.info));

    const ui = {
      tabs, layerSel, headSel, scale, scaleLabel, note: el("div", "alv-note"),
      tokens: el("div", "alv-tokens"), detail: el("div", "alv-detail"),
      mapBox: el("div", "alv-map"), canvas: el("canvas", "alv-heatmap"), tip: el("div", "alv-tip"),
      grid: el("div", "alv-grid"), stepsBox: el("div", "alv-steps"), legend: el("div", "alv-legend"),
      rampEnd: el("span"), routingBox: el("div", "alv-routing"),
    };
    ui.tip.hidden = true;
    ui.mapBox.append(ui.canvas, ui.tip);
    ui.legend.append(el("span", null, "0"), el("i", "alv-ramp"), ui.rampEnd,
      el("i", "alv-masked"), el("span", null, "masked: may not attend"));
    this.app.replaceChildren(bar, ui.note, ui.tokens, ui.detail, ui.legend, ui.mapBox, ui.grid,
      ui.stepsBox, ui.routingBox);
    // a mixture of experts: its routing, opened on the layer on show
    ui.routing = m.routing ? new Routing(ui.routingBox) : null;
    ui.routing?.show(m.routing, m.layers[state.li]);
    ui.chips = m.tokens.map((t, p) => {
      const chip = el("span", "alv-tok", shown(t));
      chip.dataset.i = p;
      chip.tabIndex = 0;
      chip.title = `#${p}`;
      if (p < m.off) chip.classList.add("alv-cached");
      ui.tokens.appendChild(chip);
      return chip;
    });
    return ui;
  }

  // ------------------------------------------------------------ weights of the query
  query() {
    return this.state.pinned ?? this.state.hover;
  }

  headsShown() {
    return this.state.head === "all" ? this.m.heads.map((_, h) => h) : [this.state.head];
  }

  // weights of query row i over the keys (NaN where masked); all heads: their mean
  rowOf(i) {
    const { m, state } = this;
    const hs = this.headsShown();
    return Float64Array.from({ length: m.S }, (_, j) =>
      hs.reduce((sum, h) => sum + m.weight(state.li, h, i, j), 0) / hs.length);
  }

  // One cell as the table writes it: weights are stored as 8-bit steps of their row's
  // largest, so a stored 0 is "below half a step", not 0.
  cellText(li, h, i, j) {
    const c = this.m.code(li, h, i, j);
    if (c === 255) return "masked";
    return c === 0 ? `< ${(this.m.top(li, h, i) / 508).toPrecision(2)}` : fmt(this.m.weight(li, h, i, j));
  }

  highlight() {
    const { m, state } = this;
    const p = this.query();
    const i = p === null ? -1 : p - m.off;
    const row = i >= 0 && m.isFull(state.li) ? this.rowOf(i) : null;
    let top = 1;
    if (row && state.rowscale) top = Math.max(...row.filter((w) => !Number.isNaN(w))) || 1;
    this.ui.chips.forEach((chip, j) => {
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
        const hs = this.headsShown();  // one head: as the table writes it; all: their mean
        chip.title = `#${p} → #${j}: ${hs.length === 1 ? this.cellText(state.li, hs[0], i, j) : fmt(row[j])}`;
      }
    });
    this.renderDetail(p, i);
    if (state.view === "head") this.drawQuery();
  }

  renderDetail(p, i) {
    const { m, state } = this;
    const { detail } = this.ui;
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
    const hs = this.headsShown();
    const rows = hs.map((h) => Float64Array.from({ length: m.S }, (_, j) => m.weight(state.li, h, i, j)));
    const mean = Float64Array.from({ length: m.S }, (_, j) => rows.reduce((s, r) => s + r[j], 0) / rows.length);
    let keys = [...Array(m.S).keys()].filter((j) => !Number.isNaN(mean[j]));
    const masked = m.S - keys.length;
    const many = keys.length > 48;
    if (many) keys = keys.sort((a, b) => mean[b] - mean[a]).slice(0, 16).sort((a, b) => a - b);
    const title = el("div", "alv-title", `#${p} “${shown(m.tokens[p], 24)}” attends to (${this.layerName(state.li)}, ` +
      (state.head === "all" ? "every head)" : `head ${m.heads[state.head]})`));
    const sub = el("div", "alv-muted", (many ? `the 16 largest of ${m.S - masked} weights · ` : "") +
      `${masked} key${masked === 1 ? "" : "s"} masked` +
      (m.precision ? ` · ${m.precision}` : ""));
    const table = el("table", "alv-weights");
    const head = el("tr");
    ["#", "key", ...hs.map((h) => `head ${m.heads[h]}`)].forEach((t) => head.appendChild(el("th", null, t)));
    table.appendChild(head);
    for (const j of keys) {
      const tr = el("tr");
      tr.dataset.j = j;
      tr.append(el("td", "alv-idx", `${j}`), el("td", "alv-key", shown(m.tokens[j], 24)));
      rows.forEach((r, k) => {
        const td = el("td", "w", this.cellText(state.li, hs[k], i, j));
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

  // ------------------------------------------------------------ images
  fullImage(li, h) {
    const { m, state } = this;
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

  thumbImage(li, h) {
    const { m, state } = this;
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

  room() {
    return Math.max(260, Math.min(820, (this.app.clientWidth || 820) - 20));
  }

  renderMap() {
    const { m, state, ui } = this;
    const single = state.head !== "all";
    ui.mapBox.hidden = !single;
    ui.grid.hidden = single;
    if (single) {
      state.geometry = drawHeatmap(ui.canvas, this.fullImage(state.li, state.head), this.labels,
        this.room(), this.labels.slice(m.off), m.off);
    } else {
      this.minis(m.heads.map((h, k) => [state.li, k, `head ${h}`]), (li, h) => this.fullImage(li, h), 150);
    }
    this.drawQuery();
  }

  // small multiples: one figure per [layer index, head index, caption]
  minis(items, imageOf, px, rowLabel) {
    const { m } = this;
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
      fig.title = m.isFull(li) ? `open ${this.layerName(li)}, head ${m.heads[h]}` : `${this.layerName(li)} is only in the overview`;
      asButton(fig, fig.title);
      const c = el("canvas");
      drawMini(c, imageOf(li, h), px, null);
      fig.append(c, el("figcaption", null, cap));
      (line || frag).appendChild(fig);
    }
    this.ui.grid.replaceChildren(frag);
  }

  drawQuery() {
    const { m, state, ui } = this;
    const p = this.query();
    const i = p === null ? null : p - m.off;
    if (state.head !== "all" && state.geometry) {
      let last = i;
      if (i !== null && i >= 0) for (let j = m.S - 1; j >= 0; j--) if (m.may(state.li, i, j)) { last = j; break; }
      drawCells(ui.canvas, state.geometry, this.fullImage(state.li, state.head), i !== null && i >= 0 ? i : null, last);
    } else if (state.head === "all") {
      ui.grid.querySelectorAll("canvas").forEach((c, h) => drawMini(c, this.fullImage(state.li, h), 150, i !== null && i >= 0 ? i : null));
    }
  }

  // ------------------------------------------------------------ steps
  renderSteps() {
    // softmax(masked × s), of the scores capped first where the model caps them (Gemma 2),
    // with the head's learned sink beside the keys where it has one (gpt-oss)
    const softmaxOf = (s) => {
      let scaled = `masked${s.scale === null ? " × scale" : ` × ${s.scale.toPrecision(4)}`}`;
      if (s.softcap) scaled = `${s.softcap}·tanh(${scaled} / ${s.softcap})`;
      return s.sinks ? `softmax([${scaled}, sink])` : `softmax(${scaled})`;
    };
    const { m } = this;
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
      [`3 · ${softmaxOf(s)}: the weights`,
        (i, j) => weightRGB(masked(i, j) ? NaN : s.weights[at(i, j)]),
        (i, j) => (masked(i, j) ? "masked" : s.weights[at(i, j)].toFixed(4))],
    ];
    const readout = el("div", "alv-muted alv-readout", "hover a cell");
    const figs = panels.map(([title, rgb, text], k) => {
      const fig = el("figure", "alv-step");
      const c = el("canvas");
      const g = drawHeatmap(c, matrixImage(m.T, m.S, rgb), this.labels,
        Math.max(200, Math.floor(this.room() / 3) - 8), this.labels.slice(m.off), m.off);
      c.addEventListener("mousemove", (e) => {
        const cell = cellAt(c, g, e);
        readout.textContent = cell ? `#${cell.i + m.off} → #${cell.j}: ` + panels.map(
          ([, , f]) => f(cell.i, cell.j)).join(" → ") : "hover a cell";
      });
      fig.append(el("figcaption", null, title), c);
      if (m.T <= 12 && m.S <= 12) fig.appendChild(this.numbers(text, k));
      return fig;
    });
    const row = el("div", "alv-steprow");
    row.append(...figs);
    this.ui.stepsBox.replaceChildren(el("div", "alv-title",
      `${this.layerName(li)}, head ${s.head}: raw scores → masked → softmax`), row, readout);
  }

  numbers(text, k) {
    const table = el("table", "alv-matrix");
    table.dataset.step = k + 1;
    for (let i = 0; i < this.m.T; i++) {
      const tr = el("tr");
      for (let j = 0; j < this.m.S; j++) tr.appendChild(el("td", null, text(i, j)));
      table.appendChild(tr);
    }
    return table;
  }

  // ------------------------------------------------------------ views
  render() {
    const { m, state, ui } = this;
    const v = state.view;
    this.app.dataset.view = v;
    ui.tabs.querySelectorAll("button").forEach((b) => b.classList.toggle("alv-on", b.dataset.view === v));
    ui.layerSel.value = `${state.li}`;
    ui.headSel.value = `${state.head}`;
    ui.layerSel.hidden = ui.headSel.hidden = v === "model" || v === "steps" || v === "routing";
    ui.tokens.hidden = !(v === "head" || v === "text");
    ui.tokens.classList.toggle("alv-flow", v === "text");
    ui.legend.hidden = v === "steps" || v === "routing";  // the routing has its own
    ui.rampEnd.textContent = rampEnd(state.rowscale);
    // the steps draw scores and weights as they are; the routing, experts' weights
    ui.scaleLabel.hidden = v === "steps" || v === "routing";
    ui.mapBox.hidden = ui.grid.hidden = ui.stepsBox.hidden = true;
    ui.routingBox.hidden = v !== "routing";
    ui.note.textContent = "";
    if (v === "head") this.renderMap();
    if (v === "model") {
      ui.grid.hidden = false;
      const items = [];
      m.layers.forEach((_, li) => m.heads.forEach((h, k) => items.push([li, k, `${h}`])));
      const px = Math.max(48, Math.min(96, Math.floor(this.room() / (m.heads.length + 1)) - 6));
      this.minis(items, (li, h) => this.thumbImage(li, h), px, (li) => this.layerName(li));
      ui.note.textContent = "every layer × head" + (m.thumb.T < m.T ? ` (max-pooled to ${m.thumb.T} cells a side)` : "") +
        "; click one to open it";
    }
    if (v === "steps") {
      ui.stepsBox.hidden = false;
      this.renderSteps();
    }
    if (v === "text") {
      ui.note.textContent = `${this.layerName(state.li)}, ` + (state.head === "all" ? "mean of every head" : `head ${m.heads[state.head]}`) +
        ": each token coloured by how much the chosen query (outlined) attends to it; hover or click a token";
    }
    this.highlight();
  }

  // ------------------------------------------------------------ wiring
  wireControls() {
    const { state, ui } = this;
    ui.tabs.addEventListener("click", (e) => {
      const b = e.target.closest("button");
      if (b) { state.view = b.dataset.view; this.render(); }
    });
    ui.layerSel.addEventListener("change", () => {
      state.li = Number(ui.layerSel.value);
      ui.routing?.pick(this.m.layers[state.li]);  // the routing tab opens on that layer too
      this.render();
    });
    ui.headSel.addEventListener("change", () => {
      state.head = ui.headSel.value === "all" ? "all" : Number(ui.headSel.value);
      this.render();
    });
    ui.scale.addEventListener("change", () => { state.rowscale = ui.scale.checked; this.render(); });
  }

  wireTokens() {
    const { state } = this;
    const hover = (i) => {
      if (state.hover !== i) { state.hover = i; this.highlight(); }
    };
    wireChips(this.ui.tokens, ".alv-tok", hover, (i) => {
      state.pinned = state.pinned === i ? null : i;
      this.highlight();
    });
  }

  wireMap() {
    const { m, state, labels } = this;
    const { canvas, tip, mapBox, grid, note } = this.ui;
    canvas.addEventListener("mousemove", (e) => {
      const cell = cellAt(canvas, state.geometry, e);
      if (!cell) { tip.hidden = true; return; }
      const p = cell.i + m.off;
      tip.textContent = `#${p} “${labels[p]}” → #${cell.j} “${labels[cell.j]}”: ` +
        this.cellText(state.li, state.head, cell.i, cell.j);
      tip.hidden = false;
      placeTip(tip, mapBox, e);
      if (state.hover !== p) { state.hover = p; this.highlight(); }
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; state.hover = null; this.highlight(); });
    canvas.addEventListener("click", (e) => {
      const cell = cellAt(canvas, state.geometry, e);
      if (cell) { const p = cell.i + m.off; state.pinned = state.pinned === p ? null : p; this.highlight(); }
    });
    grid.addEventListener("click", (e) => {
      const fig = e.target.closest(".alv-mini");
      if (!fig) return;
      const li = Number(fig.dataset.layer);
      if (!m.isFull(li)) {
        note.textContent = `${this.layerName(li)} is in this view only as the overview (the size budget); ` +
          `show(..., layer=${m.layers[li]}) embeds it in full`;
        return;
      }
      state.li = li;
      state.head = Number(fig.dataset.head);
      state.view = "head";
      this.render();
    });
    clickOnKeys(grid, ".alv-mini");
  }
}
