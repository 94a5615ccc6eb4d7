// attnlab viewer: requests to the JSON API of attnlab/viewer/app.py and the decoding of their
// answers, shared by app.js, generation.js and heads.js.
import { bytesOf } from "./view_data.js";

// fetch rejects with a TypeError ("Failed to fetch", "network error") only when no answer
// came back: the server stopped or restarts. Say that, not the browser's words alone.
export const unreachable = (err) => new Error(
  `cannot reach the server (${err.message}): is attnlab serve still running? Try again once it is`);

export async function reach(path, init) {
  try {
    return await fetch(path, init);
  } catch (err) {
    throw err.name === "AbortError" ? err : unreachable(err);
  }
}

// /api/attention with each head's lower triangle as base64 float32 (exact, and a sixth of
// the server's time of rounded number lists at 2000 tokens), decoded here into rows:
// heads[h][i] = the weights of query i on keys 0..i.
export async function attention(body) {
  const data = await api("/api/attention", { ...body, encoding: "float32" });
  const T = data.tokens.length;
  for (const layer of data.layers) {
    layer.heads = layer.heads.map((b64) => {
      const flat = new Float32Array(bytesOf(b64).buffer);  // little-endian, as every browser's CPU
      const rows = [];
      for (let i = 0, at = 0; i < T; at += ++i) rows.push(Array.from(flat.subarray(at, at + i + 1)));
      return rows;
    });
  }
  return data;
}

export async function api(path, body) {
  const res = await reach(path, body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(await errorText(res));
  return res.json();
}

// The error line of a failed answer: the API's "error", else the HTTP status.
export async function errorText(res) {
  try {
    const data = await res.json();
    return data.error || `HTTP ${res.status}`;
  } catch (_) {
    return `HTTP ${res.status}`;
  }
}

// The server-sent events of a streamed answer, parsed ({type, data}) as they arrive.
export async function* events(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      yield parseEvent(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
    }
  }
}

// One server-sent event block ("event: NAME\ndata: JSON") -> {type, data}.
function parseEvent(block) {
  let type = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  return { type, data: data ? JSON.parse(data) : null };
}
