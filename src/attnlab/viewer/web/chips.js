// attnlab viewer: the token chips' pointer and keyboard handling, which the served page
// (app.js) and the notebook view (view.js) share. viewer/notebook.py inlines this file into a
// classic script as it does draw.js, so it keeps to top-level `export function` and imports
// nothing.

// Wire a box of token chips (its elements matching `selector`, each with a data-i): pointing
// at or focusing chip i calls hover(i), leaving the box hover(null); a click, Enter or Space
// on chip i calls pin(i). The keyboard reaches every chip that has a tabIndex.
export function wireChips(box, selector, hover, pin) {
  const chipAt = (e) => {
    const chip = e.target.closest(selector);
    return chip ? Number(chip.dataset.i) : null;
  };
  const show = (e) => {
    const i = chipAt(e);
    if (i !== null) hover(i);
  };
  box.addEventListener("mouseover", show);
  box.addEventListener("focusin", show);
  box.addEventListener("mouseleave", () => hover(null));
  box.addEventListener("focusout", () => hover(null));
  box.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && chipAt(e) !== null) {
      e.preventDefault();  // Space would scroll the page
      e.target.click();
    }
  });
  box.addEventListener("click", (e) => {
    const i = chipAt(e);
    if (i !== null) pin(i);
  });
}
