// Drawing for the attention viewer: colours, token labels, heatmaps on canvas.
// It knows nothing of the API or the page's state; app.js passes in what to draw.
// A head's T x T weights become one T x T image (a pixel per cell) that the canvas scales
// up without smoothing, so 256 tokens (65,536 cells) draw in a few milliseconds.

// A white-to-navy ramp (ColorBrewer "Blues"), as a 256-entry lookup table.
const STOPS = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
const LUT = Array.from({ length: 256 }, (_, n) => {
  const x = (n / 255) * (STOPS.length - 1);
  const k = Math.min(Math.floor(x), STOPS.length - 2);
  const f = x - k;
  return STOPS[k].map((c, m) => Math.round(c + f * (STOPS[k + 1][m] - c)));
});
const FUTURE = [228, 228, 234]; // cells of later keys: masked, drawn apart from weight 0
const OUTLINE = "#e4572e";

const lut = (t) => LUT[Math.max(0, Math.min(255, Math.round(t * 255)))];

/** CSS colour of a weight t in [0, 1]. */
export function colour(t) {
  const [r, g, b] = lut(t);
  return `rgb(${r},${g},${b})`;
}

/** Text colour that stays readable on colour(t). */
export const inkFor = (t) => (t > 0.55 ? "#fff" : "#111");

/** A token as text a reader can see: whitespace made visible, long pieces cut. */
export function shown(piece, max = 12) {
  let s = piece.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  if (s.trim() === "") s = s.replace(/ /g, "␣");
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

/** One head as a T x T image; rows[i] holds the weights of query i on keys 0..i. */
export function headImage(rows, rowscale) {
  const T = rows.length;
  const img = new ImageData(T, T);
  const px = img.data;
  for (let i = 0; i < T; i++) {
    const row = rows[i];
    const top = rowscale ? (Math.max(...row) || 1) : 1;
    for (let j = 0; j < T; j++) {
      const rgb = j <= i ? lut(row[j] / top) : FUTURE;
      const o = 4 * (i * T + j);
      px[o] = rgb[0];
      px[o + 1] = rgb[1];
      px[o + 2] = rgb[2];
      px[o + 3] = 255;
    }
  }
  const off = document.createElement("canvas");
  off.width = off.height = T;
  off.getContext("2d").putImageData(img, 0, 0);
  return off;
}

/**
 * Size `canvas` for T tokens within `room` CSS pixels, draw the labels (token text when
 * cells are big enough to read, index ticks when not) and the cells. Returns the geometry
 * that drawCells and cellAt need.
 */
export function drawHeatmap(canvas, image, labels, room) {
  const T = labels.length;
  // whole pixels while labels fit; below 4 px a fractional cell uses the room better
  const fit = (room - 70) / T;
  const cell = fit >= 4 ? Math.min(28, Math.floor(fit)) : Math.max(1, fit);
  const words = cell >= 9;
  const font = `${Math.min(12, cell - 1)}px ui-monospace, monospace`;
  const measure = canvas.getContext("2d");
  measure.font = font;
  const margin = words
    ? Math.min(90, 8 + Math.max(...labels.map((s) => measure.measureText(s).width)))
    : 34;
  const size = margin + T * cell + 4;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(size * dpr);
  canvas.height = Math.round(size * dpr);
  canvas.style.width = `${size}px`;
  canvas.style.height = `${size}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#333";
  ctx.textBaseline = "middle";
  if (words) {
    ctx.font = font;
    ctx.textAlign = "right";
    labels.forEach((s, i) => ctx.fillText(s, margin - 4, margin + (i + 0.5) * cell));
    ctx.textAlign = "left";
    labels.forEach((s, j) => {
      ctx.setTransform(dpr, 0, 0, dpr, dpr * (margin + (j + 0.5) * cell), dpr * (margin - 4));
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(s, 0, 0);
    });
  } else {
    const step = [1, 2, 5, 10, 20, 25, 50, 100, 200].find((s) => s * cell >= 28) || 500;
    ctx.font = "10px ui-monospace, monospace";
    for (let i = 0; i < T; i += step) {
      ctx.textAlign = "right";
      ctx.fillText(`${i}`, margin - 4, margin + (i + 0.5) * cell);
      ctx.textAlign = "center";
      ctx.fillText(`${i}`, margin + (i + 0.5) * cell, margin - 8);
    }
  }
  const geometry = { margin, cell, T, dpr };
  drawCells(canvas, geometry, image, null);
  return geometry;
}

/** Redraw only the cells, outlining the query row (keys 0..query) when there is one. */
export function drawCells(canvas, g, image, query) {
  const ctx = canvas.getContext("2d");
  ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(image, g.margin, g.margin, g.T * g.cell, g.T * g.cell);
  if (query !== null && query < g.T) {
    ctx.strokeStyle = OUTLINE;
    ctx.lineWidth = 2;
    ctx.strokeRect(g.margin - 1, g.margin + query * g.cell - 1, (query + 1) * g.cell + 2, g.cell + 2);
  }
}

/** A small multiple: the whole head in px x px, with the query row outlined. */
export function drawMini(canvas, image, px, query) {
  const T = image.width;
  canvas.width = canvas.height = px;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(image, 0, 0, px, px);
  if (query !== null) {
    ctx.strokeStyle = OUTLINE;
    ctx.lineWidth = 2;
    ctx.strokeRect(0, (query * px) / T, ((query + 1) * px) / T, px / T);
  }
}

/** The {i, j} cell under a pointer event, or null outside the cells. */
export function cellAt(canvas, g, event) {
  if (!g) return null;
  const rect = canvas.getBoundingClientRect();
  const i = Math.floor((event.clientY - rect.top - g.margin) / g.cell);
  const j = Math.floor((event.clientX - rect.left - g.margin) / g.cell);
  return i >= 0 && j >= 0 && i < g.T && j < g.T ? { i, j } : null;
}
