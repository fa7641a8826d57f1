/* ckpt ui, the graph page: draws the lineage graph the server laid out (lanes and rows).
 *
 * Drawing scales to tens of thousands of commits: the SVG holds one path per edge kind and,
 * for the commits in view only, one circle each (beyond MAX_NODE_ELEMENTS in view, one path
 * per node class instead); every frame redraws just what is in view. Input goes through a few
 * listeners on the SVG itself (no listener per node): a click (a press without a drag) opens
 * the nearest commit, found by row buckets, not by DOM hit testing. The commit list beside the
 * graph (#commit-list) holds every commit shown, as text and links.
 *
 * DOM hooks: svg#graph (data-scale: the zoom factor; data-nodes: "elements" or "paths"),
 * circle.node[data-commit] (classes lane-N, pruned, has-ref), path.edge-parent / .edge-merge /
 * .edge-transfer, g.labels g.ref[data-ref][data-commit] (ref-branch / ref-tag, with a text),
 * #graph-tooltip, #branch-filter, #zoom-in / #zoom-out / #zoom-fit / #zoom-newest,
 * #commit-list li[data-commit]. body[data-ready="1"] after the first render and after each
 * filter change ("0" while one loads).
 */
(function () {
  "use strict";
  const C = window.ckpt;
  const LANE = 26; // px between lanes at zoom 1
  const ROW = 26; // px between rows at zoom 1
  const RADIUS = 5.5;
  const PAD = 32;
  const LABEL_ROOM = 140; // px kept right of the last lane for ref labels when fitting
  const MAX_K = 4;
  const MAX_NODE_ELEMENTS = 1500;
  const MAX_LABELS = 300;
  const KINDS = ["parent", "merge", "transfer"];

  const svg = document.getElementById("graph");
  const wrap = document.getElementById("graph-wrap");
  const tooltip = document.getElementById("graph-tooltip");
  const select = document.getElementById("branch-filter");
  const list = document.getElementById("commit-list");
  const count = document.getElementById("commit-count");
  const counts = document.getElementById("graph-counts");
  const empty = document.getElementById("graph-empty");
  if (!svg || !wrap) return;

  const gEdges = C.svg("g", { class: "edges" }, svg);
  const edgePaths = {};
  for (const kind of KINDS) edgePaths[kind] = C.svg("path", { class: "edge edge-" + kind }, gEdges);
  const leaderPath = C.svg("path", { class: "leader" }, svg); // under the commits they pass
  const ring = C.svg("circle", { class: "highlight", r: 10, visibility: "hidden" }, svg);
  const gNodes = C.svg("g", { class: "nodes" }, svg);
  const gLabels = C.svg("g", { class: "labels" }, svg);

  let G = null; // the loaded graph (see load)
  const view = { k: 1, ox: PAD, oy: PAD };
  let highlighted = -1;
  let frame = 0;

  function load(data) {
    const nodes = data.nodes;
    const byId = new Map();
    const buckets = [];
    for (let i = 0; i < nodes.length; i++) {
      byId.set(nodes[i].id, i);
      const y = nodes[i].y;
      (buckets[y] || (buckets[y] = [])).push(i);
    }
    const edges = [];
    for (const e of data.edges) {
      const c = byId.get(e.child);
      const p = byId.get(e.parent);
      if (c !== undefined && p !== undefined && edgePaths[e.kind]) edges.push({ c: c, p: p, kind: e.kind, via: e.via });
    }
    G = { data: data, nodes: nodes, byId: byId, buckets: buckets, edges: edges,
      maxRow: Math.max(0, data.rows - 1), lanes: Math.max(1, data.lanes),
      merges: new Map(Object.entries(data.merges || {})) }; // id -> method of a merge ckpt merge made
    highlighted = -1;
    if (empty) empty.hidden = nodes.length > 0;
    if (counts) {
      counts.textContent = nodes.length.toLocaleString("en-US") + (nodes.length === 1 ? " commit · " : " commits · ") +
        data.lanes + (data.lanes === 1 ? " lane" : " lanes");
    }
  }

  // -- coordinates ------------------------------------------------------------------------
  // view.k scales rows; lanes scale with it too, but never closer than kxFloor() (lanes stay
  // apart when a deep history is zoomed out to fit, unless there are too many to fit at all).
  const r1 = (v) => Math.round(v * 10) / 10;
  const clamp = (v, lo, hi) => Math.min(hi, Math.max(lo, v));

  let dims = null; // the SVG's size, read once per resize (not in the drawing loops: a forced layout each)
  function size() {
    if (!dims) dims = { w: svg.clientWidth || wrap.clientWidth || 800, h: svg.clientHeight || wrap.clientHeight || 500 };
    return dims;
  }

  function widthScale() {
    const width = (G.lanes - 1) * LANE;
    return width > 0 ? (size().w - 2 * PAD - LABEL_ROOM) / width : Infinity;
  }

  const kxFloor = () => clamp(widthScale(), 0.05, 0.6);
  const kx = () => Math.max(view.k, kxFloor());
  const sx = (lane) => view.ox + kx() * lane * LANE;
  const sy = (row) => view.oy + view.k * (G.maxRow - row) * ROW;
  const rowAt = (y) => G.maxRow - (y - view.oy) / (view.k * ROW);
  const laneAt = (x) => (x - view.ox) / (kx() * LANE);
  const radius = () => clamp(RADIUS * Math.sqrt(view.k), 1.5, 8);

  function fitScale() {
    const height = G.maxRow * ROW;
    const kh = height > 0 ? (size().h - 2 * PAD) / height : Infinity;
    return Math.min(widthScale(), kh);
  }

  const minScale = () => clamp(Math.min(0.5, fitScale() * 0.8), 0.001, 0.5);

  function fit() {
    view.k = clamp(fitScale(), minScale(), 1.6);
    view.ox = PAD;
    view.oy = PAD;
  }

  function newest() {
    view.k = 1;
    view.ox = PAD;
    view.oy = PAD;
  }

  function initialView() {
    if (fitScale() >= 1) fit();
    else newest();
  }

  function zoomAt(factor, mx, my) {
    const k = clamp(view.k * factor, minScale(), MAX_K);
    const before = kx();
    view.oy = my - (my - view.oy) * (k / view.k);
    view.k = k;
    view.ox = mx - (mx - view.ox) * (kx() / before);
    schedule();
  }

  function center(i) {
    const { w, h } = size();
    const n = G.nodes[i];
    view.ox += w / 2 - sx(n.x);
    view.oy += h / 2 - sy(n.y);
    schedule();
  }

  // -- drawing ----------------------------------------------------------------------------
  function schedule() {
    if (!frame) {
      frame = requestAnimationFrame(function () {
        frame = 0;
        render();
      });
    }
  }

  function edgePath(e, c, p, rowPx) {
    const x1 = r1(sx(c.x));
    const y1 = r1(sy(c.y));
    const x2 = r1(sx(p.x));
    const y2 = r1(sy(p.y));
    if (c.x === p.x) return "M" + x1 + " " + y1 + "L" + x2 + " " + y2;
    const bend = Math.min(rowPx, y2 - y1);
    if (e.via === c.x) { // a fork: leaves the parent, turns up the child's lane
      return "M" + x2 + " " + y2 + "C" + x2 + " " + r1(y2 - bend * 0.6) + " " + x1 + " " + r1(y2 - bend * 0.4) +
        " " + x1 + " " + r1(y2 - bend) + "L" + x1 + " " + y1;
    }
    if (e.via === p.x) { // up the parent's lane, then turns into the child
      return "M" + x2 + " " + y2 + "L" + x2 + " " + r1(y1 + bend) + "C" + x2 + " " + r1(y1 + bend * 0.4) + " " + x1 +
        " " + r1(y1 + bend * 0.6) + " " + x1 + " " + y1;
    }
    if (e.via !== null) { // a lane of its own: out of the parent, up that lane, into the child
      const xv = r1(sx(e.via));
      const half = Math.min(rowPx, (y2 - y1) / 2);
      return "M" + x2 + " " + y2 + "C" + x2 + " " + r1(y2 - half * 0.6) + " " + xv + " " + r1(y2 - half * 0.4) +
        " " + xv + " " + r1(y2 - half) + "L" + xv + " " + r1(y1 + half) + "C" + xv + " " + r1(y1 + half * 0.4) + " " +
        x1 + " " + r1(y1 + half * 0.6) + " " + x1 + " " + y1;
    }
    const ym = r1((y1 + y2) / 2);
    return "M" + x1 + " " + y1 + "C" + x1 + " " + ym + " " + x2 + " " + ym + " " + x2 + " " + y2;
  }

  function nodeClass(n) {
    return "node lane-" + (n.x % 8) + (n.pruned ? " pruned" : "") + (n.damaged ? " damaged" : "") + (n.refs.length ? " has-ref" : "");
  }

  function render() {
    if (!G) return;
    const { w, h } = size();
    const margin = 40;
    const top = rowAt(-margin);
    const bottom = rowAt(h + margin);
    const left = laneAt(-margin - LABEL_ROOM);
    const right = laneAt(w + margin);
    const rowPx = view.k * ROW;

    const parts = { parent: [], merge: [], transfer: [] };
    for (const e of G.edges) {
      const c = G.nodes[e.c];
      const p = G.nodes[e.p];
      if (c.y < bottom || p.y > top) continue;
      const lo = e.via === null ? Math.min(c.x, p.x) : Math.min(c.x, p.x, e.via);
      const hi = e.via === null ? Math.max(c.x, p.x) : Math.max(c.x, p.x, e.via);
      if (hi < left || lo > right) continue;
      parts[e.kind].push(edgePath(e, c, p, rowPx));
    }
    for (const kind of KINDS) edgePaths[kind].setAttribute("d", parts[kind].join(""));

    const visible = [];
    const yLo = Math.max(0, Math.floor(bottom));
    const yHi = Math.min(G.maxRow, Math.ceil(top));
    for (let y = yLo; y <= yHi; y++) {
      const bucket = G.buckets[y];
      if (!bucket) continue;
      for (const i of bucket) {
        const x = G.nodes[i].x;
        if (x >= left && x <= right) visible.push(i);
      }
    }

    const r = r1(radius());
    const frag = document.createDocumentFragment();
    if (visible.length <= MAX_NODE_ELEMENTS) {
      for (const i of visible) {
        const n = G.nodes[i];
        C.svg("circle", { class: nodeClass(n), cx: r1(sx(n.x)), cy: r1(sy(n.y)), r: r, "data-commit": n.id }, frag);
      }
      svg.dataset.nodes = "elements";
      svg.classList.remove("dense");
    } else {
      const groups = new Map();
      for (const i of visible) {
        const n = G.nodes[i];
        const cls = nodeClass(n);
        let bucket = groups.get(cls);
        if (!bucket) groups.set(cls, (bucket = []));
        const x = r1(sx(n.x) - r);
        bucket.push("M" + x + " " + r1(sy(n.y)) + "a" + r + " " + r + " 0 1 0 " + 2 * r + " 0a" + r + " " + r +
          " 0 1 0 " + -2 * r + " 0");
      }
      for (const [cls, d] of groups) C.svg("path", { class: cls, d: d.join("") }, frag);
      svg.dataset.nodes = "paths";
      svg.classList.add("dense");
    }
    gNodes.replaceChildren(frag);

    // Ref labels go in a column right of every lane, on their commit's row (a dotted leader
    // joins them), so they never cover another lane's commits.
    gLabels.replaceChildren();
    const leaders = [];
    if (view.k >= 0.4 && visible.length <= MAX_NODE_ELEMENTS) {
      const column = sx(G.lanes - 1) + r + 14;
      const rows = new Map();
      for (const i of visible) {
        if (G.nodes[i].refs.length) {
          const y = G.nodes[i].y;
          if (!rows.has(y)) rows.set(y, []);
          rows.get(y).push(i);
        }
      }
      let shown = 0;
      for (const [, members] of rows) {
        members.sort((a, b) => G.nodes[a].x - G.nodes[b].x);
        let x = column;
        for (const i of members) {
          const n = G.nodes[i];
          const y = sy(n.y);
          const from = sx(n.x) + r + 2;
          if (x - from > 6) leaders.push("M" + r1(from) + " " + r1(y) + "H" + r1(x - 3));
          for (const ref of n.refs) {
            if (shown >= MAX_LABELS) break;
            const tag = ref.startsWith("tag:");
            const group = C.svg("g", { class: "ref " + (tag ? "ref-tag" : "ref-branch"), "data-ref": ref,
              "data-commit": n.id }, gLabels);
            const box = C.svg("rect", { y: r1(y - 9), height: 18, rx: 9 }, group);
            const text = C.svg("text", { x: r1(x + 8), y: r1(y + 4) }, group);
            text.textContent = tag ? ref.slice(4) : ref;
            const width = text.getComputedTextLength() + 16;
            box.setAttribute("x", r1(x));
            box.setAttribute("width", r1(width));
            x += width + 4;
            shown += 1;
          }
        }
      }
    }

    leaderPath.setAttribute("d", leaders.join(""));

    if (highlighted >= 0) {
      const n = G.nodes[highlighted];
      ring.setAttribute("cx", r1(sx(n.x)));
      ring.setAttribute("cy", r1(sy(n.y)));
      ring.setAttribute("r", r1(radius() + 4));
      ring.setAttribute("visibility", "visible");
    } else {
      ring.setAttribute("visibility", "hidden");
    }
    svg.dataset.scale = view.k.toFixed(4);
  }

  // -- finding what is under the pointer ---------------------------------------------------
  function local(ev) {
    const rect = svg.getBoundingClientRect();
    return { x: ev.clientX - rect.left, y: ev.clientY - rect.top };
  }

  /** The node nearest to screen point (mx, my) within a few pixels of its circle, or -1. */
  function hit(mx, my) {
    if (!G || !G.nodes.length) return -1;
    const tol = Math.max(radius() + 3, 6);
    const row = rowAt(my);
    const span = tol / (view.k * ROW);
    let best = -1;
    let bestD = tol * tol;
    for (let y = Math.floor(row - span); y <= Math.ceil(row + span); y++) {
      const bucket = G.buckets[y];
      if (!bucket) continue;
      for (const i of bucket) {
        const n = G.nodes[i];
        const dx = sx(n.x) - mx;
        const dy = sy(n.y) - my;
        const d = dx * dx + dy * dy;
        if (d <= bestD) {
          bestD = d;
          best = i;
        }
      }
    }
    return best;
  }

  function showTooltip(i, pt) {
    const n = G.nodes[i];
    const lines = [];
    const head = C.el("div", { class: "tt-head" });
    C.el("code", null, n.short, head);
    if (n.pruned) C.el("span", { class: "pruned-mark" }, "pruned", head);
    if (n.damaged) C.el("span", { class: "damaged-mark" }, "damaged", head);
    lines.push(head);
    if (n.message) lines.push(C.el("div", { class: "tt-msg" }, n.message));
    const facts = [];
    if (n.step !== null) facts.push("step " + n.step.toLocaleString("en-US"));
    if (n.branch) facts.push(n.branch);
    facts.push(new Date(n.created_at).toLocaleString());
    lines.push(C.el("div", { class: "tt-facts" }, facts.join(" · ")));
    if (G.merges.has(n.id)) lines.push(C.el("div", { class: "tt-merge" }, "merge: " + G.merges.get(n.id)));
    if (n.refs.length) lines.push(C.el("div", { class: "tt-refs" }, n.refs.join(", ")));
    tooltip.replaceChildren(...lines);
    tooltip.hidden = false;
    const { w, h } = size();
    const x = Math.min(pt.x + 14, w - tooltip.offsetWidth - 8);
    const y = pt.y + 14 + tooltip.offsetHeight > h ? pt.y - tooltip.offsetHeight - 10 : pt.y + 14;
    tooltip.style.left = Math.max(4, x) + "px";
    tooltip.style.top = Math.max(4, y) + "px";
    svg.classList.add("over-node");
  }

  function hideTooltip() {
    tooltip.hidden = true;
    svg.classList.remove("over-node");
  }

  function open(i, ev) {
    const url = C.commitUrl(G.nodes[i].id);
    if (ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button === 1) window.open(url, "_blank", "noopener");
    else window.location.assign(url);
  }

  // -- input: a handful of listeners on the SVG, none per node -------------------------------
  let drag = null;
  svg.addEventListener("pointerdown", function (ev) {
    if (ev.button !== 0 && ev.button !== 1) return;
    drag = { x: ev.clientX, y: ev.clientY, ox: view.ox, oy: view.oy, moved: false, button: ev.button };
    svg.setPointerCapture(ev.pointerId);
  });
  svg.addEventListener("pointermove", function (ev) {
    if (drag) {
      const dx = ev.clientX - drag.x;
      const dy = ev.clientY - drag.y;
      if (!drag.moved && dx * dx + dy * dy < 16) return;
      drag.moved = true;
      svg.classList.add("dragging");
      hideTooltip();
      view.ox = drag.ox + dx;
      view.oy = drag.oy + dy;
      schedule();
      return;
    }
    const pt = local(ev);
    const i = hit(pt.x, pt.y);
    if (i >= 0) showTooltip(i, pt);
    else hideTooltip();
  });
  svg.addEventListener("pointerup", function (ev) {
    const was = drag;
    drag = null;
    svg.classList.remove("dragging");
    if (!was || was.moved) return;
    const pt = local(ev);
    const i = hit(pt.x, pt.y);
    if (i >= 0) open(i, ev);
  });
  svg.addEventListener("pointercancel", function () {
    drag = null;
    svg.classList.remove("dragging");
  });
  svg.addEventListener("pointerleave", hideTooltip);
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    const pt = local(ev);
    const unit = ev.deltaMode === 1 ? 0.05 : ev.deltaMode === 2 ? 1 : 0.0015;
    zoomAt(Math.exp(-ev.deltaY * unit), pt.x, pt.y);
  }, { passive: false });
  svg.addEventListener("keydown", function (ev) {
    const { w, h } = size();
    const moves = { ArrowLeft: [60, 0], ArrowRight: [-60, 0], ArrowUp: [0, 60], ArrowDown: [0, -60],
      PageUp: [0, h * 0.8], PageDown: [0, -h * 0.8] };
    if (moves[ev.key]) {
      view.ox += moves[ev.key][0];
      view.oy += moves[ev.key][1];
      schedule();
    } else if (ev.key === "+" || ev.key === "=") {
      zoomAt(1.25, w / 2, h / 2);
    } else if (ev.key === "-") {
      zoomAt(0.8, w / 2, h / 2);
    } else if (ev.key === "0") {
      fit();
      schedule();
    } else if (ev.key === "Home") {
      newest();
      schedule();
    } else {
      return;
    }
    ev.preventDefault();
  });

  function button(id, action) {
    const b = document.getElementById(id);
    if (b) b.addEventListener("click", action);
  }
  button("zoom-in", function () {
    const { w, h } = size();
    zoomAt(1.25, w / 2, h / 2);
  });
  button("zoom-out", function () {
    const { w, h } = size();
    zoomAt(0.8, w / 2, h / 2);
  });
  button("zoom-fit", function () {
    fit();
    schedule();
  });
  button("zoom-newest", function () {
    newest();
    schedule();
  });

  // -- the commit list ------------------------------------------------------------------------
  function listItem(n) {
    const li = C.el("li", { "data-commit": n.id });
    if (n.pruned || n.damaged) li.className = (n.pruned ? "pruned " : "") + (n.damaged ? "damaged" : "");
    C.el("a", { href: C.commitUrl(n.id) }, n.short, li);
    li.append(" ");
    C.el("span", { class: "msg" }, n.message, li);
    if (n.step !== null) {
      li.append(" ");
      C.el("span", { class: "step" }, "step " + n.step, li);
    }
    if (n.branch) {
      li.append(" ");
      C.el("span", { class: "branch" }, n.branch, li);
    }
    if (G.merges.has(n.id)) {
      li.append(" ");
      C.el("span", { class: "merge-method", title: "made by ckpt merge" }, "merge: " + G.merges.get(n.id), li);
    }
    if (n.refs.length) {
      li.append(" ");
      for (const ref of n.refs) {
        const tag = ref.startsWith("tag:");
        C.el("span", { class: "ref-badge " + (tag ? "ref-tag" : "ref-branch"), title: tag ? "tag" : "branch" },
          tag ? ref.slice(4) : ref, li);
      }
    }
    if (n.pruned) {
      li.append(" ");
      C.el("span", { class: "pruned-mark" }, "pruned", li);
    }
    if (n.damaged) {
      li.append(" ");
      C.el("span", { class: "damaged-mark" }, "damaged", li);
    }
    return li;
  }

  function renderList() {
    if (!list) return;
    const order = G.nodes.slice().sort((a, b) => b.y - a.y || a.x - b.x);
    const frag = document.createDocumentFragment();
    for (const n of order) frag.appendChild(listItem(n));
    list.replaceChildren(frag);
    if (count) count.textContent = String(order.length);
  }

  function listTarget(ev) {
    const li = ev.target instanceof Element ? ev.target.closest("li[data-commit]") : null;
    return li && G ? G.byId.get(li.dataset.commit) : undefined;
  }

  if (list) {
    list.addEventListener("mouseover", function (ev) {
      const i = listTarget(ev);
      highlighted = i === undefined ? -1 : i;
      schedule();
    });
    list.addEventListener("mouseleave", function () {
      highlighted = -1;
      schedule();
    });
    list.addEventListener("focusin", function (ev) {
      const i = listTarget(ev);
      if (i === undefined) return;
      highlighted = i;
      const n = G.nodes[i];
      const { w, h } = size();
      const x = sx(n.x);
      const y = sy(n.y);
      if (x < 0 || x > w || y < 0 || y > h) center(i);
      else schedule();
    });
  }

  // -- the branch filter ----------------------------------------------------------------------
  const banner = C.el("div", { class: "graph-error", hidden: "" });
  wrap.prepend(banner);

  if (select) {
    select.addEventListener("change", async function () {
      const branch = select.value;
      C.markBusy();
      banner.hidden = true;
      try {
        const data = await C.fetchJson(branch ? "/api/graph?branch=" + encodeURIComponent(branch) : "/api/graph");
        load(data);
        initialView();
        render();
        renderList();
        const url = new URL(window.location.href);
        if (branch) url.searchParams.set("branch", branch);
        else url.searchParams.delete("branch");
        window.history.replaceState(null, "", url);
      } catch (err) {
        C.showError(banner, err);
        banner.hidden = false;
      } finally {
        C.markReady();
      }
    });
  }

  function resized() {
    dims = null;
    schedule();
  }
  if (typeof ResizeObserver === "function") new ResizeObserver(resized).observe(wrap);
  else window.addEventListener("resize", resized);

  load(C.readJson("graph-data"));
  initialView();
  render();
  C.markReady();
})();
