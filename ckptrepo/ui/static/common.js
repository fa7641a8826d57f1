/* ckpt ui: helpers every page shares. No dependencies, no network but this app's own API.
 *
 * Strings from the repository (messages, names) are only ever inserted with textContent or
 * setAttribute, never as HTML. document.body.dataset.ready is set to "1" once the page has
 * drawn what it draws (pages that draw asynchronously carry data-async-ready and call
 * ckpt.markReady() themselves).
 */
(function () {
  "use strict";

  // The SVG namespace, read from the page's own inline logo (so no URL appears in this file).
  const logo = document.querySelector("svg.logo");
  const SVG_NS = logo ? logo.namespaceURI : document.documentElement.namespaceURI;

  /** An SVG element with attributes (set with setAttribute), appended to parent if given. */
  function svg(tag, attrs, parent) {
    const node = document.createElementNS(SVG_NS, tag);
    if (attrs) {
      for (const key of Object.keys(attrs)) node.setAttribute(key, String(attrs[key]));
    }
    if (parent) parent.appendChild(node);
    return node;
  }

  /** An HTML element with attributes and text content, appended to parent if given. */
  function el(tag, attrs, text, parent) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const key of Object.keys(attrs)) node.setAttribute(key, String(attrs[key]));
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (parent) parent.appendChild(node);
    return node;
  }

  class ApiError extends Error {
    constructor(message, hint, status) {
      super(message);
      this.hint = hint || "";
      this.status = status;
    }
  }

  /** GET a JSON document of this app; ApiError with the server's message and hint on failure. */
  async function fetchJson(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      throw new ApiError((body && body.error) || response.status + " " + response.statusText, body && body.hint,
        response.status);
    }
    return body;
  }

  /** Replace container's content with an error box (message and hint as text). */
  function showError(container, err) {
    const box = el("div", { class: "error-box", role: "alert" });
    el("strong", null, err && err.message ? err.message : String(err), box);
    if (err && err.hint) el("p", { class: "hint" }, err.hint, box);
    container.replaceChildren(box);
  }

  /** The parsed content of a <script type="application/json" id=...> data block, or null. */
  function readJson(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function commitUrl(id) {
    return "/commit/" + encodeURIComponent(id);
  }

  /** A number for people: 4 significant digits, exponent notation when very large or small. */
  function formatNumber(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return "—";
    if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
    if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString("en-US");
    const abs = Math.abs(value);
    if (abs !== 0 && (abs >= 1e6 || abs < 1e-3)) return value.toExponential((digits || 4) - 1);
    return String(Number(value.toPrecision(digits || 4)));
  }

  function markReady() {
    document.body.dataset.ready = "1";
  }

  function markBusy() {
    document.body.dataset.ready = "0";
  }

  window.ckpt = { svg, el, fetchJson, showError, readJson, commitUrl, formatNumber, markReady, markBusy, ApiError };

  document.addEventListener("DOMContentLoaded", function () {
    if (!document.body.hasAttribute("data-async-ready")) markReady();
  });
})();
