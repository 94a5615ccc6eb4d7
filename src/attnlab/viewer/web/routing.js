// attnlab's routing panel, one renderer for the served page and for notebooks: a mixture of
// experts' routing of one row, as viewer/payloads.py's routing_payload writes it. The page's
// routing panel (routing_panel.js) gets it from POST /api/routing; show()'s routing tab
// inlines this file with draw.js, chips.js and view.js as one classic script
// (viewer/fragment.py), so it keeps to top-level declarations, imports nothing else and names
// nothing the other inlined files name.
//
// The data: layers [layer labels], tokens [T row labels; the first is token #first], experts
// (E), top_k, weights [layer][token][expert] (each expert's weight in the token's output, 0
// where the token skipped it), shares [layer][expert] (the fraction of the tokens that chose
// the expert: a layer's add up to top_k), note (what the shares are over).
//
// One layer at a time, picked in a menu (the page's Layer menu picks it too) or in the loads
// table: a token x expert grid, each cell coloured by its weight on the attention map's ramp
// (draw.js) and labelled with it where the token chose the expert, hatched where it skipped
// it; the experts' row stays in sight on top as it scrolls and their shares of the tokens,
// drawn as bars, at the bottom. Under it the loads: every layer's shares, a row a layer;
// a click on one, or Enter or Space on it, opens that layer.

import { clickOnKeys } from "./chips.js";
import { colour, inkFor, shown } from "./draw.js";

function routingNode(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const routingPercent = (share) => `${Math.round(share * 100)}%`;
// a chosen expert's weight as its cell writes it: a tiny one is still no 0.00
const routingWeight = (w) => (w < 0.005 ? "<.01" : w.toFixed(2));

export class Routing {
  /** An empty routing panel in `box`; show(data) fills it. */
  constructor(box) {
    this.box = box;
    this.data = null;
    this.li = 0;  // the index in data.layers of the layer on show
    this.menu = routingNode("select", "alr-layer");
    this.menu.setAttribute("aria-label", "routing layer");
    const legend = routingNode("span", "alr-legend");
    this.top = routingNode("span", null, "1: the expert's weight in the token's output");
    legend.append(routingNode("span", null, "0"), routingNode("i", "alr-ramp"), this.top,
      routingNode("i", "alr-swatch"), routingNode("span", null, "not chosen"));
    const bar = routingNode("div", "alr-bar");
    bar.append(this.menu, legend);
    this.wrap = routingNode("div", "alr-wrap");
    this.loads = routingNode("table", "alr-loads");
    this.note = routingNode("div", "alr-note");
    box.classList.add("attnlab-routing");
    box.replaceChildren(bar, this.wrap, this.loads, this.note);
    this.wire();
  }

  /** Show `data` (routing_payload's keys; null: nothing), on layer `layer` where it has it. */
  show(data, layer = null) {
    this.data = data;
    if (!data) {
      for (const part of [this.menu, this.wrap, this.loads]) part.replaceChildren();
      this.note.textContent = "";
      return;
    }
    this.menu.replaceChildren(...data.layers.map((l, k) => new Option(`layer ${l}`, `${k}`)));
    const at = data.layers.indexOf(layer);
    this.li = at >= 0 ? at : Math.min(this.li, data.layers.length - 1);
    // a router that scales its weights (DeepSeek-V3's routed_scaling) goes past 1: the ramp
    // then ends at the largest weight shown
    this.scale = Math.max(1, ...data.weights.flat(2));
    this.top.textContent = `${this.scale === 1 ? "1" : routingWeight(this.scale)}: the expert's weight in the token's output`;
    this.note.textContent = `${data.top_k} of ${data.experts} experts a token · ${data.note}`;
    this.renderLoads();
    this.render();
  }

  /** Open layer `layer` (one of data.layers) where the data has it. */
  pick(layer) {
    const at = this.data ? this.data.layers.indexOf(layer) : -1;
    if (at >= 0 && at !== this.li) {
      this.li = at;
      this.render();
    }
  }

  render() {
    const { data, li } = this;
    this.menu.value = `${li}`;
    this.box.dataset.layer = data.layers[li];
    this.wrap.replaceChildren(this.grid(li));
    for (const tr of this.loads.querySelectorAll("tr[data-li]")) {
      tr.classList.toggle("alr-on", Number(tr.dataset.li) === li);
    }
  }

  // Layer li's tokens x experts: the experts' row on top, their shares of the tokens below.
  grid(li) {
    const { data } = this;
    const experts = [...Array(data.experts).keys()];
    const table = routingNode("table", "alr-table");
    table.setAttribute("aria-label", `layer ${data.layers[li]}: tokens by experts`);
    const corner = routingNode("th", "alr-corner", "token \\ expert");
    corner.title = "rows: tokens · columns: experts";
    const head = routingNode("tr");
    head.append(corner, ...experts.map((e) => routingNode("th", null, `${e}`)));
    const foot = routingNode("tr", "alr-shares");
    foot.append(routingNode("th", "alr-corner", "share of tokens"),
      ...experts.map((e) => this.shareCell(data.shares[li][e], e)));
    const body = routingNode("tbody");
    data.weights[li].forEach((row, i) => {
      const tr = routingNode("tr");
      tr.dataset.i = data.first + i;
      const th = routingNode("th", "alr-tok");
      th.append(routingNode("span", "alr-idx", `${data.first + i}`), shown(data.tokens[i]));
      tr.append(th, ...row.map((w, e) => this.cell(w, i, e)));
      body.appendChild(tr);
    });
    const thead = routingNode("thead");
    const tfoot = routingNode("tfoot");
    thead.appendChild(head);
    tfoot.appendChild(foot);
    table.append(thead, body, tfoot);
    return table;
  }

  cell(w, i, e) {
    const td = routingNode("td");
    const who = `#${this.data.first + i} “${shown(this.data.tokens[i], 24)}” → expert ${e}`;
    td.dataset.expert = e;
    if (w === 0) {
      td.className = "alr-skip";
      td.title = `${who}: not chosen`;
      return td;
    }
    td.className = "alr-chosen";
    td.dataset.weight = `${w}`;
    td.textContent = routingWeight(w);
    td.style.background = colour(w / this.scale);
    td.style.color = inkFor(w / this.scale);
    td.title = `${who}: weight ${w}`;
    return td;
  }

  shareCell(share, e) {
    const td = routingNode("td", "alr-share", routingPercent(share));
    td.dataset.share = `${share}`;
    td.style.setProperty("--share", routingPercent(Math.min(1, share)));
    td.title = `expert ${e}: chosen by ${routingPercent(share)} of the tokens`;
    return td;
  }

  // Every layer's shares, a row each (the layer on show marked); a row opens its layer.
  renderLoads() {
    const { data } = this;
    const head = routingNode("tr");
    head.append(routingNode("th", "alr-corner", "share of tokens"),
      ...[...Array(data.experts).keys()].map((e) => routingNode("th", null, `${e}`)));
    const rows = data.layers.map((layer, li) => {
      const tr = routingNode("tr");
      tr.dataset.li = li;
      tr.tabIndex = 0;  // the keyboard reaches every layer: Enter or Space opens it
      tr.title = `open layer ${layer}`;
      tr.append(routingNode("th", null, `layer ${layer}`),
        ...data.shares[li].map((s, e) => this.shareCell(s, e)));
      return tr;
    });
    this.loads.replaceChildren(head, ...rows);
  }

  wire() {
    this.menu.addEventListener("change", () => {
      this.li = Number(this.menu.value);
      this.render();
    });
    this.loads.addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-li]");
      if (tr) {
        this.li = Number(tr.dataset.li);
        this.render();
      }
    });
    clickOnKeys(this.loads, "tr[data-li]");
  }
}
