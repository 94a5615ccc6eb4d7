// attnlab's heads overview, one renderer for the served page and for notebooks: the per-head
// summaries as viewer/payloads.py's overview_payload writes them. The page's heads panel
// (heads.js) gets them in POST /api/heads's answer; show(..., summary=True) inlines this file
// with draw.js and chips.js as one classic script (viewer/fragment.py) and calls
// mountOverview(root, data), so it keeps to top-level declarations and imports nothing else.
//
// The data: summaries {name: [[layer][head]] means, null where no query row was real},
// summary_labels {name: label}, summary_shares [the names that are shares of a row's weight],
// summary_layers and summary_heads (labels), summary_extremes [{what, heads: [[layer, head,
// mean]]}], summary_note (what the means are over).
//
// A layer x head grid per summary, each cell labelled with its value and coloured on its
// summary's scale (a share on 0..1, so a number is the same colour in every grid; the others
// on 0..the grid's largest), as a legend says; its header row and layer column stay in sight
// while it scrolls in its box. The page shows one summary at a time, picked in a menu; a
// notebook every one side by side. A click on a cell, or Enter or Space on it, opens it: on
// the page, its layer and head in the Layer and Head menus (app.js draws them); in a notebook
// it becomes the cell on show, marked in every grid. The arrow keys move between a grid's
// cells (one tab stop per grid). A line under the grids names the cell pointed at or focused,
// else the one on show, with its values; then the most extreme heads (each opens as a cell
// does) and the note.

import { asButton, clickOnKeys } from "./chips.js";
import { overviewColours } from "./draw.js";

const OVERVIEW_STEPS = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
const NO_MEAN = { background: "rgb(200,200,200)", color: "#000" };  // no real query row

function overviewNode(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const meanText = (v) => (v === null ? "–" : `${v}`);

export class Overview {
  /**
   * An empty overview in `box`. pick: one summary at a time, picked in a menu (else every one
   * side by side). page: the served page's {onShow() -> "layer.head" of the head on show,
   * open(layer, head)}; without it a cell opened becomes the one on show.
   */
  constructor(box, { pick = false, page = null } = {}) {
    this.box = box;
    this.page = page;
    this.opened = null;  // without a page: the "layer.head" last opened
    this.data = null;
    this.pointed = null;  // the cell under the pointer
    this.focused = null;  // the cell with the keyboard focus
    this.menu = pick ? overviewNode("select", "alo-which") : null;
    if (this.menu) this.menu.setAttribute("aria-label", "summary");
    this.figures = overviewNode("div", "alo-figures");
    this.line = overviewNode("div", "alo-cell");
    this.line.setAttribute("aria-live", "polite");
    this.extremes = overviewNode("table", "alo-extremes");
    this.note = overviewNode("div", "alo-note");
    box.classList.add("attnlab-overview");
    box.replaceChildren(this.figures, this.line, this.extremes, this.note);
    this.wire();
  }

  /** Show `data` (overview_payload's keys; null: nothing), keeping the summary picked. */
  show(data) {
    Object.assign(this, { data, pointed: null, focused: null });
    const names = Object.keys((data && data.summaries) || {});
    if (this.menu && [...this.menu.options].map((o) => o.value).join() !== names.join()) {
      this.menu.replaceChildren(...names.map((name) => new Option(data.summary_labels[name], name)));
    }
    const figures = !data ? [] : this.menu ? [this.figure(this.menu)]
      : names.map((name) => this.figure(overviewNode("span", null, data.summary_labels[name])));
    this.figures.replaceChildren(...figures);
    figures.forEach((fig, k) => this.fill(fig, this.menu ? this.menu.value : names[k]));
    this.renderExtremes();
    this.note.textContent = data ? data.summary_note : "";
    this.markOnShow();
  }

  figure(title) {
    const fig = overviewNode("figure", "alo-figure");
    const caption = overviewNode("figcaption", "alo-title");
    caption.append(title);
    fig.append(caption, overviewNode("div", "alo-legend"), overviewNode("div", "alo-wrap"));
    return fig;
  }

  // One summary's legend and grid in `fig`.
  fill(fig, name) {
    const grid = this.data.summaries[name];
    const share = this.data.summary_shares.includes(name);
    const values = grid.flat().filter(Number.isFinite);
    const top = share ? 1 : Math.max(0, ...values) || 1;
    fig.dataset.summary = name;
    const [, legend, wrap] = fig.children;
    legend.replaceChildren(overviewNode("span", null, "0"), overviewNode("i", "alo-ramp"),
      overviewNode("span", "alo-top", share ? "1" : top.toFixed(2)),
      overviewNode("span", "alo-scale", share ? "a share of each row's weight" : "the largest here"));
    wrap.replaceChildren(this.table(name, top));
  }

  table(name, top) {
    const { summary_layers: layers, summary_heads: heads, summary_labels: labels } = this.data;
    const table = overviewNode("table", "alo-table");
    table.setAttribute("role", "grid");
    table.setAttribute("aria-label", `${labels[name]}: layers by heads`);
    const corner = overviewNode("th", null, "L \\ H");
    corner.title = "rows: layers (L) · columns: heads (H)";
    const header = overviewNode("tr");
    header.append(corner, ...heads.map((h) => overviewNode("th", null, `${h}`)));
    const rows = this.data.summaries[name].map((values, i) => {
      const tr = overviewNode("tr");
      tr.appendChild(overviewNode("th", null, `${layers[i]}`));
      for (const [j, value] of values.entries()) {
        const td = overviewNode("td", null, value === null ? "–" : value.toFixed(2));
        Object.assign(td.dataset, { cell: `${layers[i]}.${heads[j]}`, i, j });
        td.title = `layer ${layers[i]}, head ${heads[j]}: ${labels[name]} ${meanText(value)}`;
        td.tabIndex = -1;  // one tab stop per grid (markOnShow's cell); the arrows move
        Object.assign(td.style, value === null ? NO_MEAN : overviewColours(value / top));
        tr.appendChild(td);
      }
      return tr;
    });
    const head = overviewNode("thead");
    head.appendChild(header);
    const body = overviewNode("tbody");
    body.append(...rows);
    table.append(head, body);
    return table;
  }

  renderExtremes() {
    const rows = (this.data ? this.data.summary_extremes : []).map(({ what, heads }) => {
      const tr = overviewNode("tr");
      tr.appendChild(overviewNode("td", null, what));
      for (const [layer, head, mean] of heads) {
        const td = asButton(overviewNode("td", "alo-head", `${layer}.${head} `), `open layer ${layer}, head ${head}`);
        td.dataset.cell = `${layer}.${head}`;
        td.appendChild(overviewNode("b", null, mean === null ? "–" : mean.toFixed(3)));
        tr.appendChild(td);
      }
      return tr;
    });
    const title = overviewNode("th", null, "most extreme heads (layer.head mean)");
    title.colSpan = 4;
    const header = overviewNode("tr");
    header.appendChild(title);
    this.extremes.replaceChildren(...(rows.length ? [header, ...rows] : []));
  }

  onShow() {
    return this.page ? this.page.onShow() : this.opened;
  }

  // The cells of the head on show, one per grid (none on the page with every head on show).
  cellsOnShow() {
    const key = this.onShow();
    return key === null ? [] : [...this.figures.querySelectorAll(`td[data-cell='${key}']`)];
  }

  /** Mark the head on show in every grid, and set each grid's tab stop (the page calls it). */
  markOnShow() {
    for (const td of this.figures.querySelectorAll("td.alo-on")) td.classList.remove("alo-on");
    const on = this.cellsOnShow();
    for (const td of on) td.classList.add("alo-on");
    for (const table of this.figures.querySelectorAll("table")) {
      // the focused cell, else the one on show, else the first
      const mine = (td) => td && table.contains(td);
      const stop = [this.focused, ...on].find(mine) || table.querySelector("td");
      for (const other of table.querySelectorAll("td[tabindex='0']")) other.tabIndex = -1;
      if (stop) stop.tabIndex = 0;
    }
    this.caption();
  }

  // The line under the grids: the cell pointed at or focused, else the one on show, with its
  // values in the summaries on show.
  caption() {
    const on = this.cellsOnShow()[0];
    const td = this.pointed || this.focused || on;
    if (!td) {
      const hint = this.page ? "click a cell to open its layer and head"
        : "point at a cell for its values; click one to keep it here";
      this.line.textContent = this.data ? hint : "";
      return;
    }
    const { i, j, cell } = td.dataset;
    const [layer, head] = cell.split(".");
    const values = [...this.figures.querySelectorAll("figure")].map((fig) => {
      const name = fig.dataset.summary;
      return `${this.data.summary_labels[name]} ${meanText(this.data.summaries[name][i][j])}`;
    });
    const note = td.dataset.cell === this.onShow() ? (this.page ? " · on show above" : " · picked") : "";
    this.line.textContent = `layer ${layer}, head ${head}: ${values.join(" · ")}${note}`;
  }

  // Open a cell's head: the page picks it in its menus; here it becomes the one on show.
  open(key) {
    const [layer, head] = key.split(".");
    if (this.page) {
      this.page.open(layer, head);
    } else {
      this.opened = key;
      this.markOnShow();
    }
  }

  wire() {
    const { figures } = this;
    const cellOf = (e) => e.target.closest("td[data-cell]");
    // another summary in the one grid (rebuilt, the menu would lose the focus)
    this.menu?.addEventListener("change", () => {
      Object.assign(this, { pointed: null, focused: null });
      this.fill(figures.firstChild, this.menu.value);
      this.markOnShow();
    });
    for (const box of [figures, this.extremes]) {
      box.addEventListener("click", (e) => {
        const td = cellOf(e);
        if (td) this.open(td.dataset.cell);
      });
      clickOnKeys(box, "td[data-cell]");
    }
    figures.addEventListener("keydown", (e) => {
      const td = cellOf(e);
      const step = OVERVIEW_STEPS[e.key];
      if (!td || !step) return;
      const [i, j] = [Number(td.dataset.i) + step[0], Number(td.dataset.j) + step[1]];
      const next = td.closest("table").querySelector(`td[data-i='${i}'][data-j='${j}']`);
      e.preventDefault();  // the arrows would scroll the box
      if (next) next.focus();
    });
    // the line follows the pointer and the focus; a focused cell is its grid's tab stop
    const follow = (key, enter, leave, then) => {
      figures.addEventListener(enter, (e) => { this[key] = cellOf(e); then(); });
      figures.addEventListener(leave, () => { this[key] = null; this.caption(); });
    };
    follow("pointed", "mouseover", "mouseleave", () => this.caption());
    follow("focused", "focusin", "focusout", () => this.markOnShow());
  }
}

/** show(..., summary=True)'s view: every summary side by side in the root's .alv-app. */
export function mountOverview(root, data) {
  new Overview(root.querySelector(".alv-app")).show(data);
  root.dataset.ready = "1";
}
