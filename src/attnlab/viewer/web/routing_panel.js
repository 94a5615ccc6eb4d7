// attnlab viewer, routing panel: a mixture of experts' routing of the tokens on show (POST
// /api/routing), drawn by routing.js as show()'s routing tab is. Shown only for a model with
// n_experts (a dense model gets no panel and no request); it follows the tokens on show (a
// text's, or a generation's) and the page's Layer menu. app.js knows nothing of this file.

import { api } from "./api.js";
import { $, setStatus } from "./dom.js";
import { Routing } from "./routing.js";

const panel = {
  ids: null,  // the token ids of the routing on show
  seq: 0,     // drops answers that a newer request replaced
};
const routing = new Routing($("routing-view"));

function status(text, isError = false) {
  setStatus($("routing-status"), text, isError);
}

// Whether the served model is a mixture of experts (GET /api/model, which app.js loads).
function mixture() {
  const model = window.attnlab && window.attnlab.model;
  return Boolean(model && model.config.n_experts);
}

const same = (a, b) => a !== null && a.length === b.length && a.every((id, i) => id === b[i]);

// Route the tokens on show, unless their routing is on show already.
async function refresh() {
  if (!mixture()) return;
  $("routing").hidden = false;
  const ids = [...((window.attnlab && window.attnlab.ids) || [])];
  if (same(panel.ids, ids)) return;
  const seq = ++panel.seq;
  panel.ids = null;
  if (!ids.length) {  // the text could not be read: its status line says why
    routing.show(null);
    status("");
    return;
  }
  status("routing…");
  try {
    const data = await api("/api/routing", { ids });
    if (seq !== panel.seq) return;
    panel.ids = ids;
    routing.show(data, Number($("layer").value));
    status("");
  } catch (err) {
    if (seq === panel.seq) {
      routing.show(null);
      status(err.message, true);
    }
  }
}

new MutationObserver(refresh).observe($("tokens"), { childList: true });
$("layer").addEventListener("change", () => routing.pick(Number($("layer").value)));
