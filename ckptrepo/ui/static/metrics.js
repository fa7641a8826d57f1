/* ckpt ui, the metrics page: one chart of every chosen metric along every chosen branch, from
 * the JSON API (the URL is the chart container's data-api, made by the server). Colour tells
 * series apart; the dash pattern tells metrics apart. */
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
      const series = data.series.map(function (s, i) {
        return {
          label: s.branch + " · " + s.name,
          points: s.points.map((p) => [p.x, p.y]),
          commits: s.points.map((p) => p.commit),
          color: C.PALETTE[i % C.PALETTE.length],
          dash: C.DASHES[(names.get(s.name) || 0) % C.DASHES.length],
        };
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
