/* ckpt ui, the metrics page: one chart of every chosen metric along every chosen branch, from
 * the JSON API (the URL is the chart container's data-api, made by the server). Colour tells
 * series apart; the dash pattern tells metrics apart. Values that are annotations (the API's
 * per-series "annotated" indices: attached after the commit, e.g. by ckpt eval) form a series of
 * their own, labelled "(annotation)" and drawn dotted with hollow diamonds (chart.js). */
(function () {
  "use strict";
  const C = window.ckpt;
  const box = document.getElementById("metrics-chart");
  if (!box) {
    C.markReady();
    return;
  }
  C.fetchJson(box.dataset.api)
    .then(function (data) {
      const names = new Map(data.names.map((n, i) => [n, i]));
      const series = [];
      data.series.forEach(function (s, i) {
        const marked = new Set(s.annotated || []);
        const color = C.PALETTE[i % C.PALETTE.length];
        const label = s.branch + " · " + s.name;
        const logged = s.points.filter((p, j) => !marked.has(j));
        const annotated = s.points.filter((p, j) => marked.has(j));
        if (logged.length || !annotated.length) {
          series.push({ label: label, points: logged.map((p) => [p.x, p.y]), commits: logged.map((p) => p.commit),
            color: color, dash: C.DASHES[(names.get(s.name) || 0) % C.DASHES.length] });
        }
        if (annotated.length) {
          series.push({ label: label + " (annotation)", points: annotated.map((p) => [p.x, p.y]),
            commits: annotated.map((p) => p.commit), color: color, annotation: true });
        }
      });
      C.lineChart(box, {
        series: series,
        xLabel: data.x_axis === "step" ? "step" : "commit (first-parent position)",
        yLabel: data.names.length === 1 ? data.names[0] : "value",
        height: 380,
        empty: data.names.length ? "None of these commits records these metrics." : "Choose a metric above.",
      });
    })
    .catch(function (err) {
      C.showError(box, err);
    })
    .finally(C.markReady);
})();
