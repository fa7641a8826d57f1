/* ckpt ui, the tensor history page: charts of the norm, the standard deviation and the change
 * from commit to commit, from the page's #history-data block (oldest first). */
(function () {
  "use strict";
  const C = window.ckpt;
  try {
    const data = C.readJson("history-data");
    const xLabel = data.x_axis === "step" ? "step" : "commit (first-parent position)";
    const line = (label, key, color) => ({ label: label, points: data.x.map((x, i) => [x, data[key][i]]),
      commits: data.commit, color: color });
    const charts = [
      ["chart-norm", [line("L2 norm", "l2_norm", "#2563eb")], "‖x‖₂"],
      ["chart-std", [line("std", "std", "#16a34a")], "std"],
      ["chart-change", [line("chunks changed", "changed_fraction", "#ea580c")], "fraction"],
      ["chart-deltas", [line("Δ L2 norm", "d_l2_norm", "#2563eb"), line("Δ mean", "d_mean", "#9333ea"),
        line("Δ std", "d_std", "#16a34a")], "Δ"],
    ];
    for (const [id, series, yLabel] of charts) {
      const box = document.getElementById(id);
      if (box) {
        C.lineChart(box, { series: series, xLabel: xLabel, yLabel: yLabel, height: 220,
          yInclude: id === "chart-change" ? [0, 1] : [] });
      }
    }
  } catch (err) {
    const box = document.getElementById("history-charts");
    if (box) C.showError(box, err);
  } finally {
    C.markReady();
  }
})();
