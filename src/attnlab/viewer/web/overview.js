// attnlab viewer, the heads overview: the per-head summaries that POST /api/heads answers
// with (heads.js asks for them and hands them here), one summary at a time as a layer x head
// grid whose header row and layer column stay in sight while it scrolls in its box. A click
// on a cell, or Enter or Space on it, picks its layer and head in the page's Layer and Head
// menus, as a user picking them would (app.js draws them); the arrow keys move between the
// cells, which are one tab stop; the line under the grid names the cell pointed at or
// focused, else the one on show. Its colours and scales are those of the notebook's heads
// overview (show(..., summary=True), viewer/summary_view.py), so that a number is the same
// colour in both; a legend says the scale.

import { clickOnKeys } from "./chips.js";
import { $ } from "./dom.js";
import { overviewColours } from "./draw.js";

const overview = {
  summaries: null,  // {summary: [[layer][head]]}
  labels: {},       // {summary: its label}
  shares: new Set(),  // the summaries that are shares of a row's weight, coloured on 0..1
  pointed: null,    // the cell under the pointer
  focused: null,    // the cell with the keyboard focus
};

const STEPS = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };

/**
 * Show these summaries (null: none), keeping the summary picked in the menu; shares: those
 * coloured on 0..1 (the others on 0..the grid's largest value), as /api/heads names them.
 */
export function showOverview(summaries, labels = {}, shares = []) {
  Object.assign(overview, { summaries, labels, shares: new Set(shares), pointed: null, focused: null });
  const select = $("overview-which");
  const names = Object.keys(summaries || {});
  if (select.options.length !== names.length) {
    select.replaceChildren(...names.map((name) => new Option(labels[name], name)));
  }
  render();
}

function cell(tag, text) {
  const c = document.createElement(tag);
  c.textContent = text;
  return c;
}

// The chosen summary's mean per layer (rows) and head (columns), and the legend of its scale.
function render() {
  const name = $("overview-which").value;
  const grid = overview.summaries && overview.summaries[name];
  $("overview-legend").hidden = !grid;
  if (!grid) {
    $("overview-table").replaceChildren();
    $("overview-cell").textContent = "";
    return;
  }
  const share = overview.shares.has(name);
  const top = share ? 1 : Math.max(0, ...grid.flat().filter(Number.isFinite)) || 1;
  $("overview-top").textContent = share ? "1" : top.toFixed(2);
  $("overview-scale").textContent = share ? "a share of each row's weight" : "the largest here";
  const corner = cell("th", "L \\ H");
  corner.title = "rows: layers (L) · columns: heads (H)";
  const header = document.createElement("tr");
  header.append(corner, ...grid[0].map((_, h) => cell("th", `${h}`)));
  const rows = grid.map((values, layer) => {
    const tr = document.createElement("tr");
    tr.appendChild(cell("th", `${layer}`));
    for (const [h, value] of values.entries()) {
      const td = cell("td", value.toFixed(2));
      td.dataset.cell = `${layer}.${h}`;
      td.tabIndex = -1;  // one tab stop for the grid (markOnShow's cell); arrows move
      Object.assign(td.style, overviewColours(value / top));
      tr.appendChild(td);
    }
    return tr;
  });
  const head = document.createElement("thead");
  head.appendChild(header);
  const body = document.createElement("tbody");
  body.append(...rows);
  $("overview-table").replaceChildren(head, body);
  markOnShow();
}

// The cell of the layer and head on show in the page's menus (none with every head on show).
function onShow() {
  return $("overview-table").querySelector(`td[data-cell='${$("layer").value}.${$("head").value}']`);
}

function markOnShow() {
  const table = $("overview-table");
  for (const td of table.querySelectorAll("td.on")) td.classList.remove("on");
  const td = onShow();
  if (td) td.classList.add("on");
  // the grid's tab stop: the focused cell, else the one on show, else the first
  const stop = overview.focused || td || table.querySelector("td");
  for (const other of table.querySelectorAll("td[tabindex='0']")) other.tabIndex = -1;
  if (stop) stop.tabIndex = 0;
  caption();
}

// The line under the grid: the cell pointed at or focused, else the one on show.
function caption() {
  const td = overview.pointed || overview.focused || onShow();
  if (!td) {
    $("overview-cell").textContent = overview.summaries ? "click a cell to open its layer and head" : "";
    return;
  }
  const [layer, h] = td.dataset.cell.split(".").map(Number);
  const name = $("overview-which").value;
  const value = overview.summaries[name][layer][h];
  const note = td === onShow() ? " · on show above" : "";
  $("overview-cell").textContent = `layer ${layer}, head ${h}: ${overview.labels[name]} ${value}${note}`;
}

// Pick a cell's layer and head in the page's menus, as a user would: app.js draws them.
function open(td) {
  const [layer, h] = td.dataset.cell.split(".");
  for (const [id, value] of [["head", h], ["layer", layer]]) {
    const select = $(id);
    if (select.value === value) continue;
    select.value = value;
    select.dispatchEvent(new Event("change"));
  }
}

function wire() {
  const table = $("overview-table");
  const cellOf = (e) => e.target.closest("td[data-cell]");
  $("overview-which").addEventListener("change", render);
  table.addEventListener("click", (e) => {
    const td = cellOf(e);
    if (td) open(td);
  });
  clickOnKeys(table, "td[data-cell]");
  table.addEventListener("keydown", (e) => {
    const td = cellOf(e);
    const step = STEPS[e.key];
    if (!td || !step) return;
    const [layer, h] = td.dataset.cell.split(".").map(Number);
    const next = table.querySelector(`td[data-cell='${layer + step[0]}.${h + step[1]}']`);
    e.preventDefault();  // the arrows would scroll the box
    if (next) next.focus();
  });
  // the caption follows the pointer and the focus; a focused cell is the grid's tab stop
  const follow = (key, enter, leave, then) => {
    table.addEventListener(enter, (e) => { overview[key] = cellOf(e); then(); });
    table.addEventListener(leave, () => { overview[key] = null; caption(); });
  };
  follow("pointed", "mouseover", "mouseleave", caption);
  follow("focused", "focusin", "focusout", markOnShow);
  for (const id of ["layer", "head"]) $(id).addEventListener("change", markOnShow);
}

wire();
