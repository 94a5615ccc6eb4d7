// attnlab.show()'s view: the payload notebook.py writes, decoded into what each cell holds
// (nothing about the page). Inlined with draw.js, chips.js and view.js into one classic script.
//
// The payload (viewer/notebook.py writes it; all arrays are base64 of zlib-compressed bytes):
//   tokens[S]         labels of the key tokens; queries are the last T of them (off = S - T)
//   layers, heads     labels of the traced layers and heads; full: indices of the layers
//                     whose weights come at full resolution
//   weights           uint8 per cell of the full layers, by layer, head, query row: the
//                     weight as a fraction of its row's largest (0..254), 255 masked;
//                     tri: only keys 0..off+i of row i are stored (the rest are masked)
//   rowmax            float32 per (full layer, head, row): the row's largest weight
//   masks, layerMask  bit-packed (T, S) "may attend" masks and which one each layer uses
//   thumb             {T, S, codes}: every layer x head max-pooled to at most T x S cells,
//                     uint8 weight * 254, 255 where the whole block is masked
//   steps             {layer, head, scores, weights, scale}: one head's raw scores and
//                     weights, float32 (T, S), for the raw -> masked -> softmax view

// base64 -> bytes (api.js decodes the served page's weights with it too)
export function bytesOf(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let k = 0; k < bin.length; k++) out[k] = bin.charCodeAt(k);
  return out;
}

async function inflate(b64) {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)");
  }
  const stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const floats = async (b64) => new Float32Array((await inflate(b64)).buffer);

// The decoded payload: what each cell holds, and nothing about the page.
export async function decode(data) {
  const { T, S } = data;
  const off = S - T;
  const nh = data.heads.length;
  const codes = await inflate(data.weights);
  const rowmax = await floats(data.rowmax);
  const masks = await Promise.all(data.masks.map(inflate));
  const thumbCodes = await inflate(data.thumb.codes);
  const steps = data.steps && {
    ...data.steps, scores: await floats(data.steps.scores), weights: await floats(data.steps.weights),
  };
  const rowStart = (i) => (data.tri ? i * (off + 1) + (i * (i - 1)) / 2 : i * S);
  const headCells = rowStart(T);
  const fullOf = new Map(data.full.map((li, fi) => [li, fi]));
  const may = (li, i, j) => {
    const k = i * S + j;
    return (masks[data.layerMask[li]][k >> 3] >> (7 - (k & 7))) & 1;
  };
  // the stored code of a cell: 0..254 of its row's largest, 255 masked
  const code = (li, h, i, j) => {
    if (!may(li, i, j) || (data.tri && j > off + i)) return 255;
    return codes[(fullOf.get(li) * nh + h) * headCells + rowStart(i) + j];
  };
  const top = (li, h, i) => rowmax[(fullOf.get(li) * nh + h) * T + i];
  const weight = (li, h, i, j) => {
    const c = code(li, h, i, j);
    return c === 255 ? NaN : (c / 254) * top(li, h, i);
  };
  const thumbCode = (li, h, i, j) =>
    thumbCodes[((li * nh + h) * data.thumb.T + i) * data.thumb.S + j];
  return { ...data, off, nh, may, code, top, weight, thumbCode, steps, isFull: (li) => fullOf.has(li) };
}
