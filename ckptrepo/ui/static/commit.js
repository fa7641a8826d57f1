/* ckpt ui, the commit page: the similar commits (section#similar; its data-api, made by the server,
 * is /api/similar?rev=ID), read once the page is shown and drawn as a table: each commit linked,
 * with a link to the diff against this one, its share of this commit's chunk bytes and the
 * statistics' distance bound. Repository strings go in with textContent only (ckpt.el).
 * DOM hooks: #similar-body, table#similar-table tr[data-commit].
 */
(function () {
  "use strict";
  const C = window.ckpt;
  const box = document.getElementById("similar");
  const body = document.getElementById("similar-body");
  const article = document.querySelector("article[data-commit]");
  if (!box || !body || !article) {
    C.markReady();
    return;
  }
  const self = article.dataset.commit;
  const COLUMNS = [["Commit", ""], ["Message", ""], ["Step", "num"], ["Branch", ""], ["Shared bytes", "num"],
    ["Weights matched", "num"], ["Distance ≥", "num"], ["", ""]];

  function percent(fraction) {
    if (typeof fraction !== "number" || !Number.isFinite(fraction)) return "—";
    return Number((100 * fraction).toPrecision(3)) + "%";
  }

  function row(s, tbody) {
    const tr = C.el("tr", { "data-commit": s.commit_id }, null, tbody);
    const link = C.el("a", { class: "commit-link", href: C.commitUrl(s.commit_id) }, null, C.el("td", null, null, tr));
    C.el("code", null, s.short_id, link);
    C.el("td", { class: "msg" }, s.message, tr);
    C.el("td", { class: "num" }, s.step === null ? "—" : C.formatNumber(s.step), tr);
    C.el("td", { class: "branch" }, s.branch || "—", tr);
    C.el("td", { class: "num shared", title: C.formatNumber(s.shared_bytes) + " B" }, percent(s.shared_fraction), tr);
    C.el("td", { class: "num matched", title: "this commit's weights the other holds (by name and shape, or same bytes)" },
      s.matched_tensors + " / " + s.query_tensors, tr);
    C.el("td", { class: "num distance", title: "lower bound of the relative L2 distance, from stored statistics" },
      C.formatNumber(s.stat_distance, 3), tr);
    const diff = C.el("td", null, null, tr);
    C.el("a", { class: "diff-link", href: "/diff/" + encodeURIComponent(s.commit_id) + "/" + encodeURIComponent(self) },
      "diff", diff);
  }

  C.fetchJson(box.dataset.api)
    .then(function (data) {
      if (!data.similar.length) {
        body.replaceChildren(C.el("p", { class: "none" }, "No other readable commit shares chunks or tensor names with this one."));
        return;
      }
      const table = C.el("table", { class: "data compact", id: "similar-table" });
      const head = C.el("tr", null, null, C.el("thead", null, null, table));
      for (const [label, cls] of COLUMNS) C.el("th", cls ? { scope: "col", class: cls } : { scope: "col" }, label, head);
      const tbody = C.el("tbody", null, null, table);
      for (const s of data.similar) row(s, tbody);
      const wrap = C.el("div", { class: "table-wrap" });
      wrap.appendChild(table);
      body.replaceChildren(wrap);
    })
    .catch(function (err) {
      C.showError(body, err);
    })
    .finally(C.markReady);
})();
