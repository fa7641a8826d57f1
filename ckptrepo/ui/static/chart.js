/* ckpt ui: a small SVG line chart (axes, nice ticks, grid, legend, hover read-out, click to
 * open a point's commit). No dependencies; labels are set with textContent.
 *
 * ckpt.lineChart(container, {series, xLabel, yLabel, height, empty, yInclude}) draws into container
 * (replacing what it held) and redraws when the container is resized. Each series:
 * {label, points: [[x, y], ...] (y null or non-finite: a gap), commits: [id, ...] (optional,
 * parallel to points), color, dash, annotation}; yInclude: values the y axis always covers. A series with
 * annotation true holds values attached after the commits (annotations, not metrics logged while
 * training): drawn dotted with hollow diamond markers, in the legend too. DOM hooks: svg.line-chart,
 * path.series[data-series] (path.series-annotation), path.marker-annotation, ul.chart-legend li[data-series]
 * (li.legend-annotation).
 */
(function () {
  "use strict";
  const C = window.ckpt;
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
    "#4b5563", "#65a30d"];
  const DASHES = ["", "6 4", "2 3", "10 3 2 3"];
  const MARGIN = { l: 64, r: 18, t: 14, b: 42 };
  const ANNOTATION_DASH = "1.5 3.5";
  const ANNOTATION_MARKERS = 2000; // an annotation series draws its markers up to this many points

  /** A diamond centred on (x, y), as path data. */
  function diamond(x, y, r) {
    return "M" + x + " " + (y - r) + "L" + (x + r) + " " + y + "L" + x + " " + (y + r) + "L" + (x - r) + " " + y + "Z";
  }

  function niceStep(range, count) {
    const raw = range / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  }

  /** Round bounds and evenly spaced ticks covering [lo, hi]. */
  function scale(lo, hi, count) {
    if (!(hi > lo)) {
      const pad = Math.abs(lo) * 0.1 || 1;
      lo -= pad;
      hi += pad;
    }
    const step = niceStep(hi - lo, count);
    const start = Math.floor(lo / step) * step;
    const end = Math.ceil(hi / step) * step;
    const ticks = [];
    for (let i = 0; start + i * step <= end + step * 1e-9 && i < 100; i++) {
      const v = start + i * step;
      ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return { lo: start, hi: end, step: step, ticks: ticks };
  }

  function tickLabel(v, step) {
    const abs = Math.abs(v);
    if (abs !== 0 && (abs >= 1e6 || abs < 1e-3)) return v.toExponential(1);
    const decimals = Math.max(0, Math.min(8, -Math.floor(Math.log10(step) + 1e-9)));
    return Number(v.toFixed(decimals)).toLocaleString("en-US", { maximumFractionDigits: decimals });
  }

  const finite = (v) => typeof v === "number" && Number.isFinite(v);

  function nearestIndex(sorted, x) {
    let lo = 0;
    let hi = sorted.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (sorted[mid][0] < x) lo = mid;
      else hi = mid;
    }
    return Math.abs(sorted[lo][0] - x) <= Math.abs(sorted[hi][0] - x) ? lo : hi;
  }

  function draw(container, opts) {
    container.replaceChildren();
    const series = opts.series.map(function (s, i) {
      const points = s.points.map((p, j) => [p[0], p[1], s.commits ? s.commits[j] : null]);
      const valid = points.filter((p) => finite(p[0]) && finite(p[1]));
      return { label: s.label, points: points, valid: valid, sorted: valid.slice().sort((a, b) => a[0] - b[0]),
        color: s.color || PALETTE[i % PALETTE.length], annotation: !!s.annotation,
        dash: s.annotation ? ANNOTATION_DASH : s.dash !== undefined ? s.dash : "" };
    });
    const all = series.flatMap((s) => s.valid);
    if (!all.length) {
      C.el("p", { class: "empty chart-empty" }, opts.empty || "No data to plot.", container);
      return;
    }
    const width = Math.max(320, Math.floor(container.clientWidth || 640));
    const height = opts.height || 280;
    const innerW = width - MARGIN.l - MARGIN.r;
    const innerH = height - MARGIN.t - MARGIN.b;
    let xmin = Infinity;
    let xmax = -Infinity;
    let ymin = Infinity;
    let ymax = -Infinity;
    for (const p of all) {
      if (p[0] < xmin) xmin = p[0];
      if (p[0] > xmax) xmax = p[0];
      if (p[1] < ymin) ymin = p[1];
      if (p[1] > ymax) ymax = p[1];
    }
    for (const v of opts.yInclude || []) { // values the y axis always shows (a fraction's 0 and 1)
      ymin = Math.min(ymin, v);
      ymax = Math.max(ymax, v);
    }
    const xs = scale(xmin, xmax, Math.max(2, Math.floor(innerW / 90)));
    const ys = scale(ymin, ymax, Math.max(2, Math.floor(innerH / 45)));
    const X = (v) => MARGIN.l + ((v - xs.lo) / (xs.hi - xs.lo)) * innerW;
    const Y = (v) => MARGIN.t + innerH - ((v - ys.lo) / (ys.hi - ys.lo)) * innerH;
    const r1 = (v) => Math.round(v * 10) / 10;

    const svg = C.svg("svg", { class: "line-chart", width: width, height: height, viewBox: "0 0 " + width + " " + height,
      role: "img", "aria-label": (opts.yLabel || "value") + " by " + (opts.xLabel || "x") }, container);
    const grid = C.svg("g", { class: "grid" }, svg);
    const axes = C.svg("g", { class: "axes" }, svg);
    for (const t of ys.ticks) {
      const y = r1(Y(t));
      C.svg("line", { x1: MARGIN.l, x2: MARGIN.l + innerW, y1: y, y2: y }, grid);
      C.svg("text", { x: MARGIN.l - 8, y: y + 4, class: "tick tick-y" }, axes).textContent = tickLabel(t, ys.step);
    }
    for (const t of xs.ticks) {
      const x = r1(X(t));
      C.svg("line", { x1: x, x2: x, y1: MARGIN.t, y2: MARGIN.t + innerH }, grid);
      C.svg("text", { x: x, y: MARGIN.t + innerH + 18, class: "tick tick-x" }, axes).textContent = tickLabel(t, xs.step);
    }
    C.svg("line", { class: "axis", x1: MARGIN.l, x2: MARGIN.l + innerW, y1: MARGIN.t + innerH, y2: MARGIN.t + innerH }, axes);
    C.svg("line", { class: "axis", x1: MARGIN.l, x2: MARGIN.l, y1: MARGIN.t, y2: MARGIN.t + innerH }, axes);
    if (opts.xLabel) {
      C.svg("text", { class: "axis-label", x: MARGIN.l + innerW / 2, y: height - 6 }, axes).textContent = opts.xLabel;
    }
    if (opts.yLabel) {
      const yl = C.svg("text", { class: "axis-label", x: 0, y: 0,
        transform: "translate(14 " + (MARGIN.t + innerH / 2) + ") rotate(-90)" }, axes);
      yl.textContent = opts.yLabel;
    }

    const lines = C.svg("g", { class: "series-group" }, svg);
    series.forEach(function (s, i) {
      let d = "";
      let pen = false;
      for (const p of s.points) {
        if (!finite(p[0]) || !finite(p[1])) {
          pen = false;
          continue;
        }
        d += (pen ? "L" : "M") + r1(X(p[0])) + " " + r1(Y(p[1]));
        pen = true;
      }
      const attrs = { class: s.annotation ? "series series-annotation" : "series", d: d, stroke: s.color, "data-series": i };
      if (s.dash) attrs["stroke-dasharray"] = s.dash;
      C.svg("path", attrs, lines);
      if (s.annotation && s.valid.length <= ANNOTATION_MARKERS) {
        for (const p of s.valid) {
          C.svg("path", { class: "marker marker-annotation", d: diamond(r1(X(p[0])), r1(Y(p[1])), 4), stroke: s.color,
            "data-series": i }, lines);
        }
      } else if (s.valid.length <= 60) {
        for (const p of s.valid) C.svg("circle", { class: "marker", cx: r1(X(p[0])), cy: r1(Y(p[1])), r: 2.6, fill: s.color }, lines);
      }
    });

    const cross = C.svg("line", { class: "crosshair", y1: MARGIN.t, y2: MARGIN.t + innerH, visibility: "hidden" }, svg);
    const dots = series.map((s) => C.svg("circle", { class: "hover-dot", r: 4, fill: s.color, visibility: "hidden" }, svg));
    const overlay = C.svg("rect", { class: "overlay", x: MARGIN.l, y: MARGIN.t, width: innerW, height: innerH }, svg);
    const tip = C.el("div", { class: "tooltip chart-tooltip", hidden: "" }, null, container);

    function nearest(ev) {
      const rect = svg.getBoundingClientRect();
      const mx = ev.clientX - rect.left;
      const my = ev.clientY - rect.top;
      const x = xs.lo + ((mx - MARGIN.l) / innerW) * (xs.hi - xs.lo);
      return { mx: mx, my: my, hits: series.map((s) => (s.sorted.length ? s.sorted[nearestIndex(s.sorted, x)] : null)) };
    }

    overlay.addEventListener("pointermove", function (ev) {
      const found = nearest(ev);
      let anchor = null;
      const rows = [];
      found.hits.forEach(function (p, i) {
        if (!p) {
          dots[i].setAttribute("visibility", "hidden");
          return;
        }
        dots[i].setAttribute("cx", r1(X(p[0])));
        dots[i].setAttribute("cy", r1(Y(p[1])));
        dots[i].setAttribute("visibility", "visible");
        if (anchor === null || Math.abs(X(p[0]) - found.mx) < Math.abs(X(anchor) - found.mx)) anchor = p[0];
        const row = C.el("div", { class: "tt-row" });
        const sw = C.el("span", { class: "tt-swatch" }, null, row);
        sw.style.background = series[i].color;
        C.el("span", { class: "tt-label" }, series[i].label + ": ", row);
        C.el("strong", null, C.formatNumber(p[1], 5) + (opts.xLabel ? "  (" + opts.xLabel + " " + C.formatNumber(p[0], 6) + ")" : ""), row);
        rows.push(row);
      });
      if (anchor === null) return;
      cross.setAttribute("x1", r1(X(anchor)));
      cross.setAttribute("x2", r1(X(anchor)));
      cross.setAttribute("visibility", "visible");
      tip.replaceChildren(...rows);
      tip.hidden = false;
      const left = found.mx + 16 + tip.offsetWidth > width ? found.mx - tip.offsetWidth - 12 : found.mx + 16;
      tip.style.left = Math.max(0, left) + "px";
      tip.style.top = Math.max(0, found.my - 10) + "px";
    });
    overlay.addEventListener("pointerleave", function () {
      tip.hidden = true;
      cross.setAttribute("visibility", "hidden");
      for (const dot of dots) dot.setAttribute("visibility", "hidden");
    });
    overlay.addEventListener("click", function (ev) {
      const found = nearest(ev);
      let best = null;
      let bestD = 14 * 14;
      for (const p of found.hits) {
        if (!p || !p[2]) continue;
        const dx = X(p[0]) - found.mx;
        const dy = Y(p[1]) - found.my;
        if (dx * dx + dy * dy <= bestD) {
          bestD = dx * dx + dy * dy;
          best = p;
        }
      }
      if (best) window.location.assign(C.commitUrl(best[2]));
    });

    const legend = C.el("ul", { class: "chart-legend" }, null, container);
    series.forEach(function (s, i) {
      const li = C.el("li", s.annotation ? { "data-series": i, class: "legend-annotation" } : { "data-series": i }, null,
        legend);
      const sw = C.svg("svg", { class: "swatch", viewBox: "0 0 28 10", "aria-hidden": "true" }, li);
      const line = { x1: 1, y1: 5, x2: 27, y2: 5, stroke: s.color, "stroke-width": 2.5 };
      if (s.dash) line["stroke-dasharray"] = s.dash;
      C.svg("line", line, sw);
      if (s.annotation) C.svg("path", { class: "marker-annotation", d: diamond(14, 5, 3.5), stroke: s.color }, sw);
      C.el("span", null, s.label + (s.valid.length ? "" : " (no points)"), li);
    });
  }

  /** Draw the chart and redraw it when its container is resized. */
  function lineChart(container, opts) {
    draw(container, opts);
    let last = container.clientWidth;
    if (typeof ResizeObserver === "function") {
      new ResizeObserver(function () {
        if (Math.abs(container.clientWidth - last) > 4) {
          last = container.clientWidth;
          draw(container, opts);
        }
      }).observe(container);
    }
  }

  C.lineChart = lineChart;
  C.PALETTE = PALETTE;
  C.DASHES = DASHES;
})();
