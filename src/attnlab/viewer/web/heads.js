// attnlab viewer, heads panel: head detector scores (POST /api/heads), click a head to ablate
// it and see the next-token prediction change, the heads overview (the same answer's
// per-head summaries, drawn by overview.js), and the logit lens (POST /api/lens) of the
// token under the pointer in the Tokens row. Scores the tokens on show (a generation's too),
// or #text before any is; app.js knows nothing of this file.

import { api } from "./api.js";
import { clickOnKeys } from "./chips.js";
import { $, setStatus } from "./dom.js";
import { shown } from "./draw.js";
import { Overview } from "./overview.js";

const DETECTORS = ["previous_token", "duplicate_token", "induction", "first_token"];

const heads = {
  ids: null,         // the token ids the scores and lens are for
  scores: null,      // {detector: [[layer][head]]}
  ablated: new Set(), // "layer.head"
  lens: null,        // {layers, top: [layer][position][k] {text, prob}}
  seq: 0,
};
window.attnlabHeads = heads;
const LENS_HINT = $("lens").textContent;  // index.html's: how to see a token's lens
// the heads overview, one summary at a time; its cells open a head in the Layer and Head menus
const overview = new Overview($("overview"), {
  pick: true,
  page: { onShow: () => `${$("layer").value}.${$("head").value}`, open: pickHead },
});

// The status while the text on show is the one scored.
function scored() {
  status(`scored on ${heads.lens.top[0].length} tokens; click a head to ablate it`);
}

function pairs() {
  return [...heads.ablated].map((key) => key.split(".").map(Number));
}

function status(text, isError = false) {
  setStatus($("heads-status"), text, isError);
}

function shownIds() {
  return (window.attnlab && window.attnlab.ids) || [];
}

// Whether the Tokens row still shows the tokens the heads were scored on.
function current() {
  const onShow = shownIds();
  return heads.ids !== null && heads.ids.length === onShow.length &&
    heads.ids.every((id, i) => id === onShow[i]);
}

// Forget the scores, predictions and lens, so that nothing on show describes another text.
function clearHeads() {
  Object.assign(heads, { ids: null, scores: null, lens: null });
  $("heads-table").querySelector("thead").replaceChildren();
  $("heads-table").querySelector("tbody").replaceChildren();
  overview.show(null);
  for (const id of ["heads-intact", "heads-edited", "heads-which"]) $(id).textContent = "";
  $("lens").textContent = "";
}

// Score the tokens on show (the Tokens row: a text's, or a generation's), or the Text box's
// text while the row is empty.
async function score() {
  const shown = shownIds();
  const input = shown.length ? { ids: [...shown] } : { text: $("text").value };
  const seq = ++heads.seq;
  status("scoring heads…");
  try {
    const [result, lens] = await Promise.all([
      api("/api/heads", { ...input, ablate: pairs() }),
      api("/api/lens", input),
    ]);
    if (seq !== heads.seq) return;
    heads.ids = lens.ids;
    heads.scores = result.scores;
    heads.lens = lens;
    renderTable(result.induction_ranking);
    overview.show(result);
    renderPrediction(result.prediction);
    scored();
    redrawLens();
  } catch (err) {
    if (seq === heads.seq) {
      clearHeads();
      status(err.message, true);
    }
  }
}

async function predict() {  // only after a click on a head of the text on show
  const seq = ++heads.seq;
  try {
    const result = await api("/api/heads", { ids: heads.ids, ablate: pairs() });
    if (seq === heads.seq) renderPrediction(result.prediction);
  } catch (err) {
    if (seq === heads.seq) status(err.message, true);
  }
}

// Pick a layer and head in the page's menus, as a user would: app.js draws them.
function pickHead(layer, h) {
  for (const [id, value] of [["head", h], ["layer", layer]]) {
    const select = $(id);
    if (select.value === value) continue;
    select.value = value;
    select.dispatchEvent(new Event("change"));
  }
}

function renderTable(ranking) {
  const head = document.createElement("tr");
  for (const name of ["head", ...DETECTORS.map((d) => d.replace("_", " ")), "state"]) {
    const th = document.createElement("th");
    th.textContent = name;
    head.appendChild(th);
  }
  const rows = ranking.map(([layer, h]) => {
    const key = `${layer}.${h}`;
    const tr = document.createElement("tr");
    tr.dataset.head = key;
    tr.tabIndex = 0;  // the keyboard reaches every head: Enter or Space ablates it
    tr.classList.toggle("ablated", heads.ablated.has(key));
    const cells = [key, ...DETECTORS.map((d) => heads.scores[d][layer][h].toFixed(3))];
    for (const [i, value] of cells.entries()) {
      const td = document.createElement("td");
      td.textContent = value;
      if (i > 0) td.style.setProperty("--score", value);
      tr.appendChild(td);
    }
    const box = document.createElement("td");
    box.textContent = heads.ablated.has(key) ? "ablated" : "on";
    tr.appendChild(box);
    return tr;
  });
  $("heads-table").querySelector("thead").replaceChildren(head);
  $("heads-table").querySelector("tbody").replaceChildren(...rows);
}

function renderPrediction(prediction) {
  const list = (items) => items.map((t) => `${shown(t.text)} ${(t.prob * 100).toFixed(1)}%`)
    .join(" · ");
  $("heads-intact").textContent = list(prediction.intact);
  $("heads-edited").textContent = heads.ablated.size
    ? list(prediction.ablated) : "(no head ablated)";
  $("heads-which").textContent = heads.ablated.size ? [...heads.ablated].join(", ") : "";
}

function renderLens(position) {
  const box = $("lens");
  if (!heads.lens || !current() || position >= heads.lens.top[0].length) {
    box.textContent = "score the heads of the tokens on show to see their logit lens";
    return;
  }
  const rows = heads.lens.layers.map((name, layer) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = name;
    tr.appendChild(th);
    for (const t of heads.lens.top[layer][position]) {
      const td = document.createElement("td");
      td.textContent = `${shown(t.text)} ${(t.prob * 100).toFixed(1)}%`;
      td.style.setProperty("--score", t.prob);
      tr.appendChild(td);
    }
    return tr;
  });
  const table = document.createElement("table");
  table.id = "lens-table";
  table.append(...rows);
  const title = document.createElement("div");
  title.className = "muted";
  title.textContent = `logit lens at token ${position}: most likely next tokens read after each layer`;
  box.replaceChildren(title, table);
}

// The lens box once the scores are for the tokens on show: the pinned token's lens, or how to
// see one (not what it said of the text before).
function redrawLens() {
  const pinned = window.attnlab ? window.attnlab.pinned : null;
  if (pinned === null) $("lens").textContent = LENS_HINT;
  else renderLens(pinned);
}

function wire() {
  $("heads-run").addEventListener("click", score);
  const toggle = (e) => {
    const row = e.target.closest("tr[data-head]");
    if (!row || heads.ids === null) return;
    if (!current()) {  // a prediction for tokens no longer on show would mislead
      status("the tokens on show are not the ones scored; press Score heads for them", true);
      return;
    }
    const key = row.dataset.head;
    if (heads.ablated.has(key)) heads.ablated.delete(key); else heads.ablated.add(key);
    row.classList.toggle("ablated", heads.ablated.has(key));
    row.lastChild.textContent = heads.ablated.has(key) ? "ablated" : "on";
    predict();
  };
  $("heads-table").addEventListener("click", toggle);
  clickOnKeys($("heads-table"), "tr[data-head]");
  // a new Tokens row (another text, or a generation): the lens and the status on show
  // described the scored one; back on it, the scores answer again
  new MutationObserver(() => {
    if (!heads.lens) return;
    if (current()) {
      scored();
      redrawLens();
    } else {
      renderLens(0);
      status("the scores below are for another text; press Score heads for this one");
    }
  }).observe($("tokens"), { childList: true });
  for (const id of ["layer", "head"]) $(id).addEventListener("change", () => overview.markOnShow());
  for (const type of ["mouseover", "focusin"]) {  // pointer or keyboard on a token
    $("tokens").addEventListener(type, (e) => {
      const chip = e.target.closest(".tok");
      if (chip) renderLens(Number(chip.dataset.i));
    });
  }
}

wire();
