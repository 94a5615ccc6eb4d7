// Drawing for the attention viewer and for attnlab.show()'s views: colours, token labels,
// heatmaps on canvas. It knows nothing of the API or the page's state; app.js (the served
// page), view.js (the self-contained notebook view) and overview.js (the heads overview, in
// both) pass in what to draw. viewer/fragment.py inlines this file into a classic script by
// dropping the `export` keywords, so it keeps to top-level `export function` / `export const`
// and imports nothing.
// A head's T x S weights become one T x S image (a pixel per cell) that the canvas scales
// up without smoothing, so 256 tokens (65,536 cells) draw in a few milliseconds.

// The [r, g, b] at t in [0, 1] between evenly spaced colour stops.
function between(stops, t) {
  const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const k = Math.min(Math.floor(x), stops.length - 2);
  const f = x - k;
  return stops[k].map((c, m) => Math.round(c + f * (stops[k + 1][m] - c)));
}

// 256-entry lookup tables between colour stops; LUT is white-to-navy (ColorBrewer "Blues").
const ramp = (stops) => Array.from({ length: 256 }, (_, n) => between(stops, n / 255));
const LUT = ramp([[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]]);
const FUTURE = [228, 228, 234]; // cells of later keys: masked, drawn apart from weight 0
const OUTLINE = "#e4572e";
// scores: blue (negative) - white - red (positive), ColorBrewer "RdBu" reversed
const DIVERGING = ramp([[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]]);

// viridis at five stops (matplotlib's), low dark and high light: the heads overview's colours
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

const lut = (t) => LUT[Math.max(0, Math.min(255, Math.round(t * 255)))];

/**
 * Background and text colours of a heads overview's cell at t in [0, 1] (overview.js): viridis,
 * with black or white ink by its luminance.
 */
export function overviewColours(t) {
  const [r, g, b] = between(VIRIDIS, t);
  return { background: `rgb(${r},${g},${b})`, color: 0.299 * r + 0.587 * g + 0.114 * b > 140 ? "#000" : "#fff" };
}

/** CSS colour of a weight t in [0, 1]. */
export function colour(t) {
  const [r, g, b] = lut(t);
  return `rgb(${r},${g},${b})`;
}

/**
 * The legend's label for the darkest colour: weight 1, or with "scale rows to max" each row's
 * largest weight (headImage's rowscale).
 */
export const rampEnd = (rowscale) => (rowscale ? "row max" : "1");

/** Text colour that stays readable on colour(t). */
export const inkFor = (t) => (t > 0.55 ? "#fff" : "#111");

/**
 * A token as text a reader can see: whitespace made visible, an empty one ∅, long pieces cut.
 * Every token text of the page and of a notebook view goes through it; the tokenizers write
 * control characters visible before (tokenizers/token_bytes.py's visible_controls).
 */
export function shown(piece, max = 12) {
  if (piece === "") return "∅";
  let s = piece.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  if (s.trim() === "") s = s.replace(/ /g, "␣");
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

/** A T x S matrix as an image (a pixel per cell); rgbAt(i, j) gives the cell's [r, g, b]. */
export function matrixImage(T, S, rgbAt) {
  const img = new ImageData(S, T);
  const px = img.data;
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < S; j++) {
      const rgb = rgbAt(i, j);
      const o = 4 * (i * S + j);
      px[o] = rgb[0];
      px[o + 1] = rgb[1];
      px[o + 2] = rgb[2];
      px[o + 3] = 255;
    }
  }
  const off = document.createElement("canvas");
  off.width = S;
  off.height = T;
  off.getContext("2d").putImageData(img, 0, 0);
  return off;
}

/** The [r, g, b] of a weight t in [0, 1], or of a masked cell when t is NaN. */
export const weightRGB = (t) => (Number.isNaN(t) ? FUTURE : lut(t));

/** The [r, g, b] of a score v on a blue-white-red ramp over [-lim, lim]; -inf is masked. */
export function scoreRGB(v, lim) {
  if (!Number.isFinite(v)) return FUTURE;
  return DIVERGING[Math.max(0, Math.min(255, Math.round(((v / (lim || 1)) + 1) * 127.5)))];
}

/** Whether query i may attend to key j: j <= i, and with a sliding window, i - window < j. */
export const sees = (i, j, window) => j <= i && !(window && j <= i - window);

/** One head as a T x T image; rows[i] holds the weights of query i on keys 0..i. */
export function headImage(rows, rowscale, window = null) {
  const tops = rows.map((row) => (rowscale ? (Math.max(...row) || 1) : 1));
  return matrixImage(rows.length, rows.length,
    (i, j) => (sees(i, j, window) ? lut(rows[i][j] / tops[i]) : FUTURE));
}

/**
 * Size `canvas` for S key tokens (columns, `labels`) and T query tokens (rows, `rowLabels`,
 * by default the same) within `room` CSS pixels, draw the labels (token text when cells are
 * big enough to read, index ticks when not) and the cells. Returns the geometry that
 * drawCells and cellAt need. `first` is the position of the first row (queries are the last
 * T of S tokens under a KV cache).
 */
export function drawHeatmap(canvas, image, labels, room, rowLabels = labels, first = 0) {
  const S = labels.length;
  const T = rowLabels.length;
  // whole pixels while labels fit; below 4 px a fractional cell uses the room better
  const fit = (room - 70) / S;
  const cell = fit >= 4 ? Math.min(28, Math.floor(fit)) : Math.max(1, fit);
  const words = cell >= 9;
  const font = `${Math.min(12, cell - 1)}px ui-monospace, monospace`;
  const measure = canvas.getContext("2d");
  measure.font = font;
  const margin = words
    ? Math.min(90, 8 + Math.max(...labels.map((s) => measure.measureText(s).width)))
    : 34;
  const width = margin + S * cell + 4;
  const height = margin + T * cell + 4;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#333";
  ctx.textBaseline = "middle";
  if (words) {
    ctx.font = font;
    ctx.textAlign = "right";
    rowLabels.forEach((s, i) => ctx.fillText(s, margin - 4, margin + (i + 0.5) * cell));
    ctx.textAlign = "left";
    labels.forEach((s, j) => {
      ctx.setTransform(dpr, 0, 0, dpr, dpr * (margin + (j + 0.5) * cell), dpr * (margin - 4));
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(s, 0, 0);
    });
  } else {
    const step = [1, 2, 5, 10, 20, 25, 50, 100, 200].find((s) => s * cell >= 28) || 500;
    ctx.font = "10px ui-monospace, monospace";
    ctx.textAlign = "right";
    for (let i = 0; i < T; i += step) ctx.fillText(`${first + i}`, margin - 4, margin + (i + 0.5) * cell);
    ctx.textAlign = "center";
    for (let j = 0; j < S; j += step) ctx.fillText(`${j}`, margin + (j + 0.5) * cell, margin - 8);
  }
  const geometry = { margin, cell, T, S, dpr };
  drawCells(canvas, geometry, image, null);
  return geometry;
}

/**
 * Redraw only the cells, outlining the query row when there is one: keys 0..query, or
 * 0..`last` when the row's last attendable key is given (KV cache, padding).
 */
export function drawCells(canvas, g, image, query, last = query) {
  const ctx = canvas.getContext("2d");
  ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(g.margin - 3, g.margin - 3, g.S * g.cell + 6, g.T * g.cell + 6); // the old outline
  ctx.drawImage(image, g.margin, g.margin, g.S * g.cell, g.T * g.cell);
  if (query !== null && query >= 0 && query < g.T) {
    ctx.strokeStyle = OUTLINE;
    ctx.lineWidth = 2;
    ctx.strokeRect(g.margin - 1, g.margin + query * g.cell - 1, (last + 1) * g.cell + 2, g.cell + 2);
  }
}

/** A small multiple: the whole head in px x px, with the query row outlined. */
export function drawMini(canvas, image, px, query) {
  const T = image.height;
  const S = image.width;
  canvas.width = canvas.height = px;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(image, 0, 0, px, px);
  if (query !== null) {
    ctx.strokeStyle = OUTLINE;
    ctx.lineWidth = 2;
    ctx.strokeRect(0, (query * px) / T, ((query + 1 + S - T) * px) / S, px / T);
  }
}

/**
 * Put a shown tooltip below right of a pointer event over a cell map, or flipped where that
 * would run out of the visible area of `box`, the scrolled element both sit in.
 */
export function placeTip(tip, box, event) {
  const right = box.scrollLeft + box.clientWidth;
  const bottom = box.scrollTop + box.clientHeight;
  const x = event.offsetX + 14 + tip.offsetWidth > right ? event.offsetX - tip.offsetWidth - 8 : event.offsetX + 14;
  const y = event.offsetY + 14 + tip.offsetHeight > bottom ? event.offsetY - tip.offsetHeight - 8 : event.offsetY + 14;
  tip.style.left = `${Math.max(0, x)}px`;
  tip.style.top = `${Math.max(0, y)}px`;
}

/** The {i, j} cell under a pointer event, or null outside the cells. */
export function cellAt(canvas, g, event) {
  if (!g) return null;
  const rect = canvas.getBoundingClientRect();
  const i = Math.floor((event.clientY - rect.top - g.margin) / g.cell);
  const j = Math.floor((event.clientX - rect.left - g.margin) / g.cell);
  return i >= 0 && j >= 0 && i < g.T && j < g.S ? { i, j } : null;
}
