// attnlab viewer, Generate panel: POST /api/generate, its new tokens shown as they stream in
// (with tokens/s), Stop, and at the end the generation's ids handed to the attention view.
// app.js wires it (`wireGeneration`); this file knows nothing of the page's state.
import { errorText, events, reach, unreachable } from "./api.js";
import { $, setStatus } from "./dom.js";

const countTokens = (n) => `${n} token${n === 1 ? "" : "s"}`;
const status = (text, isError = false) => setStatus($("gen-status"), text, isError);

let running = null; // AbortController of the running generation

// show(ids, generatedFrom): draw the attention of `ids`, whose new tokens start at
// generatedFrom; blockSize(): the model's context length.
export function wireGeneration({ show, blockSize }) {
  $("gen").addEventListener("click", () => generate(show, blockSize));
  $("stop").addEventListener("click", () => running && running.abort());
}

function request() {
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  return {
    text: $("prompt").value, max_new_tokens: num("max_new_tokens") ?? 40,
    temperature: num("temperature") ?? 1, top_k: num("top_k"), top_p: num("top_p"),
    min_p: num("min_p"), typical_p: num("typical_p"),
    repetition_penalty: num("repetition_penalty"),
    no_repeat_ngram_size: num("no_repeat_ngram_size"), seed: num("seed"),
  };
}

async function generate(show, blockSize) {
  const body = request();
  const out = $("output");
  out.querySelector(".prompt-text").textContent = body.text;
  const newText = out.querySelector(".new-text");
  newText.textContent = "";
  running = new AbortController();
  $("gen").disabled = true;
  $("stop").disabled = false;
  status("generating…");
  const t0 = performance.now();
  let count = 0;
  let done = null;
  let ids = [];  // the prompt's (the `start` event), then each new token's
  let promptLength = 0;
  try {
    const res = await reach("/api/generate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: running.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    for await (const event of events(res)) {
      if (event.type === "start") {
        ids = event.data.prompt_ids;
        promptLength = ids.length;
      } else if (event.type === "token") {
        newText.textContent += event.data.text;
        if (event.data.id !== null) {
          count += 1;
          ids.push(event.data.id);
        }
        const secs = (performance.now() - t0) / 1000;
        status(`${countTokens(count)} · ${(count / secs).toFixed(1)} tokens/s`);
      } else if (event.type === "done") {
        done = event.data;
      } else if (event.type === "error") {
        throw new Error(event.data.error);
      }
    }
  } catch (err) {
    if (err.name === "AbortError") status(`stopped after ${countTokens(count)}`);
    else status((err instanceof TypeError ? unreachable(err) : err).message, true);
  } finally {
    $("gen").disabled = false;
    $("stop").disabled = true;
    running = null;
  }
  // The generation's attention goes to the token view; the Text box keeps what the user typed.
  // A generation that fills the context ends with a token the model never read (as in
  // `attnlab generate`): the view shows the first block tokens.
  const block = blockSize();
  if (done) {
    const why = { eot: "end of text", block_size: "context full", max_new_tokens: "max tokens" };
    const unread = done.ids.length > block ? " (but the last token, which it never read)" : "";
    status(`${countTokens(done.new_tokens)} (${why[done.reason] || done.reason}) · its attention is shown above${unread}`);
    await show(done.ids.slice(0, block), done.ids.length - done.new_tokens);
  } else if (count > 0) {  // stopped: the ids it got (their text need not encode back to them)
    await show(ids.slice(0, block), promptLength);
  }
}
