// attnlab viewer: what the page's scripts (app.js, generation.js, heads.js) share of the DOM.

export const $ = (id) => document.getElementById(id);

// A status line: its text, red when it reports an error.
export function setStatus(el, text, isError = false) {
  el.textContent = text;
  el.classList.toggle("error", isError);
}
