// attnlab API docs: renders the server's own /openapi.json as plain HTML. Swagger UI loads
// from a CDN, which left /docs blank offline; this page needs nothing but the server.
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// Follow "#/components/schemas/Name" references inside the same document.
function resolve(spec, schema) {
  if (schema && schema.$ref) {
    const path = schema.$ref.replace(/^#\//, "").split("/");
    return { ...path.reduce((node, key) => node[key], spec), refName: path[path.length - 1] };
  }
  return schema || {};
}

function typeOf(spec, schema) {
  const s = resolve(spec, schema);
  if (s.anyOf) return s.anyOf.map((x) => typeOf(spec, x)).join(" | ");
  if (s.refName) return s.refName;
  if (s.type === "array") return `array of ${typeOf(spec, s.items)}`;
  return s.type || "any";
}

function limitsOf(spec, schema) {
  const s = resolve(spec, schema);
  const parts = (s.anyOf || [s]).flatMap((x) => {
    const r = resolve(spec, x);
    return [
      r.minimum !== undefined ? `≥ ${r.minimum}` : null,
      r.exclusiveMinimum !== undefined ? `> ${r.exclusiveMinimum}` : null,
      r.maximum !== undefined ? `≤ ${r.maximum}` : null,
    ].filter(Boolean);
  });
  return parts.join(", ");
}

function schemaTable(spec, schema) {
  const s = resolve(spec, schema);
  if (!s.properties) return el("p", { class: "muted" }, typeOf(spec, schema));
  const required = new Set(s.required || []);
  const rows = Object.entries(s.properties).map(([name, prop]) => el("tr", {},
    el("td", { class: "mono" }, name + (required.has(name) ? " *" : "")),
    el("td", { class: "mono" }, typeOf(spec, prop)),
    el("td", {}, prop.default !== undefined ? JSON.stringify(prop.default) : ""),
    el("td", {}, limitsOf(spec, prop)),
    el("td", {}, prop.description || ""),
  ));
  const head = el("tr", {}, ...["field", "type", "default", "limits", "meaning"].map((h) => el("th", {}, h)));
  return el("div", { class: "table-wrap" },
    el("table", { class: "schema" }, el("thead", {}, head), el("tbody", {}, ...rows)),
    s.description ? el("p", { class: "muted" }, s.description) : null);
}

function operation(spec, path, method, op) {
  const body = op.requestBody && op.requestBody.content["application/json"];
  const responses = Object.entries(op.responses || {}).map(([code, r]) => {
    const [kind, content] = Object.entries(r.content || {})[0] || [null, null];
    const schema = content && content.schema;
    return el("div", { class: "response" },
      el("div", {}, el("b", {}, code), ` ${r.description || ""}`, kind ? el("span", { class: "muted" }, ` (${kind})`) : null),
      schema ? schemaTable(spec, schema) : null);
  });
  return el("section", { class: "panel endpoint", "data-path": path },
    el("h2", {}, el("span", { class: `method ${method}` }, method.toUpperCase()), " ", el("code", {}, path)),
    el("p", {}, op.description || op.summary || ""),
    body ? el("div", { class: "heading" }, "Request body (JSON)") : null,
    body ? schemaTable(spec, body.schema) : null,
    el("div", { class: "heading" }, "Responses"),
    ...responses);
}

async function main() {
  try {
    const res = await fetch("/openapi.json");
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const spec = await res.json();
    $("api-info").textContent = `${spec.info.title} · version ${spec.info.version} · ${spec.info.description || ""}`;
    const sections = Object.entries(spec.paths).flatMap(([path, methods]) =>
      Object.entries(methods).map(([method, op]) => operation(spec, path, method, op)));
    $("endpoints").replaceChildren(...sections);
  } catch (err) {
    $("api-info").textContent = `cannot read /openapi.json: ${err.message}`;
  }
  document.body.dataset.ready = "1";
}

main();
