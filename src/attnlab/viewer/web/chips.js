// attnlab viewer: what acts on a click, for the pointer and the keyboard alike: the token
// chips, and the buttons that are not <button>s (thumbnails, the heads table's rows, the
// heads overview's cells). The served page (app.js, heads.js) and the notebook views (view.js,
// overview.js) share it. viewer/fragment.py inlines this file into a classic script as it does
// draw.js, so it keeps to top-level `export function` and imports nothing.

// Enter or Space on an element of `box` matching `selector` clicks it, as on a <button>.
export function clickOnKeys(box, selector) {
  box.addEventListener("keydown", (e) => {
    const target = e.target.closest(selector);
    if ((e.key === "Enter" || e.key === " ") && target && box.contains(target)) {
      e.preventDefault();  // Space would scroll the page
      target.click();
    }
  });
}

// `el` as a button for the keyboard and a screen reader: a tab stop, announced as a button
// named `label`; the box it sits in takes Enter and Space with clickOnKeys.
export function asButton(el, label) {
  el.setAttribute("role", "button");
  el.setAttribute("aria-label", label);
  el.tabIndex = 0;
  return el;
}

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
  clickOnKeys(box, selector);
  box.addEventListener("click", (e) => {
    const i = chipAt(e);
    if (i !== null) pin(i);
  });
}
