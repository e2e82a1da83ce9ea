/*
 * The dashboard's line charts: inline SVG drawn here, no library, nothing fetched from
 * anywhere (the page's Content-Security-Policy allows no other site). This file knows nothing
 * of the API: app.js hands a chart its series and its time range, and calls it again when new
 * samples arrive.
 *
 *   raftcronCharts.lineChart(figure, {
 *     title, yLabel,                 the caption, and what the values are (the y axis' title)
 *     format(value) -> text,         a value as the axis and the legend write it
 *     fromMs, toMs,                  the time range drawn (Unix ms, the x axis)
 *     series: [{name, label, points: [[atMs, value or null], ...]}],
 *     emptyText,                     said in the chart when no series has a point
 *     gaps: [[fromMs, toMs], ...],   intervals not measured, shaded (optional)
 *   })
 *
 * A null value breaks the line: an interval nobody measured is not drawn as a zero. A point
 * with no neighbour is drawn as a dot. Each series' class is `series-<name>` (app.css colours
 * it). What a test reads: the figure's data-state ("empty" or "drawn") and data-points (the
 * points drawn, every series together); each line's data-series, data-points and data-max (its
 * highest value drawn).
 */
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 560;
  const HEIGHT = 200;
  const MARGIN = {top: 10, right: 12, bottom: 24, left: 62};
  const Y_TICKS_MAX = 5; // lines across the chart, its top included
  const X_TICKS_MAX = 6;
  const TICK_MINUTES = [0.25, 0.5, 1, 2, 5, 10, 15, 30, 60];

  function svg(tag, attributes, text) {
    const element = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      element.setAttribute(name, String(value));
    }
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function html(tag, className, text) {
    const element = document.createElement(tag);
    if (className) element.className = className;
    if (text !== undefined) element.textContent = text;
    return element;
  }

  /**
   * The value axis for values up to `max`: a step of 1, 2 or 5 times a power of ten, and as
   * many steps (at most Y_TICKS_MAX - 1) as reach `max`, so every label is a round number.
   */
  function valueAxis(max) {
    if (!(max > 0)) return {step: 0.25, top: 1};
    const rough = max / (Y_TICKS_MAX - 1);
    const power = 10 ** Math.floor(Math.log10(rough));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough * (1 - 1e-9));
    return {step, top: step * Math.max(1, Math.ceil(max / step - 1e-9))};
  }

  /** Round minutes (or quarter minutes) on the time axis, at most X_TICKS_MAX of them. */
  function timeTicks(fromMs, toMs) {
    const minutes = (toMs - fromMs) / 60000;
    const every = TICK_MINUTES.find((step) => minutes / step <= X_TICKS_MAX) || 120;
    const stepMs = every * 60000;
    const ticks = [];
    for (let at = Math.ceil(fromMs / stepMs) * stepMs; at <= toMs; at += stepMs) ticks.push(at);
    return {ticks, seconds: stepMs < 60000};
  }

  function clockText(ms, seconds) {
    const date = new Date(ms);
    const two = (number) => String(number).padStart(2, "0");
    const text = `${two(date.getHours())}:${two(date.getMinutes())}`;
    return seconds ? `${text}:${two(date.getSeconds())}` : text;
  }

  /** The SVG path of one series: M/L commands, a null starting a new piece. */
  function pathOf(points, x, y) {
    const pieces = [];
    let piece = [];
    for (const [atMs, value] of points) {
      if (value === null || value === undefined || !Number.isFinite(value)) {
        if (piece.length) pieces.push(piece);
        piece = [];
      } else {
        piece.push(`${x(atMs).toFixed(1)} ${y(value).toFixed(1)}`);
      }
    }
    if (piece.length) pieces.push(piece);
    // A lone point is a zero-length segment: with round caps it shows as a dot.
    return pieces.map((one) => (one.length === 1 ? `M${one[0]} l0 0` : `M${one.join(" L")}`)).join(" ");
  }

  function legend(spec, counts) {
    const box = html("span", "legend");
    for (const series of spec.series) {
      const item = html("span", `legend-item series-${series.name}`);
      item.append(html("i", "swatch"), html("span", "", ` ${series.label} `));
      const last = [...series.points].reverse().find(([, value]) => value !== null && value !== undefined);
      item.append(html("b", "", last && counts.get(series.name) ? spec.format(last[1]) : "–"));
      item.title = `${series.label}: the latest value`;
      box.append(item);
    }
    return box;
  }

  function lineChart(figure, spec) {
    const {fromMs, toMs} = spec;
    const inRange = (points) => points.filter(([atMs]) => atMs >= fromMs && atMs <= toMs);
    const series = spec.series.map((one) => ({...one, points: inRange(one.points)}));
    const counts = new Map(series.map((one) => [
      one.name, one.points.filter(([, value]) => value !== null && value !== undefined).length,
    ]));
    const total = [...counts.values()].reduce((sum, count) => sum + count, 0);
    const values = series.flatMap((one) => one.points.map(([, value]) => value))
      .filter((value) => value !== null && value !== undefined && Number.isFinite(value));
    const {step, top} = valueAxis(Math.max(0, ...values));

    const left = MARGIN.left;
    const right = WIDTH - MARGIN.right;
    const upper = MARGIN.top;
    const lower = HEIGHT - MARGIN.bottom;
    const span = Math.max(1, toMs - fromMs);
    const x = (atMs) => left + ((atMs - fromMs) / span) * (right - left);
    const y = (value) => lower - (Math.min(value, top) / top) * (lower - upper);

    const chart = svg("svg", {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart-svg", role: "img", "aria-label": spec.title,
    });
    for (const [from, to] of spec.gaps || []) {
      const start = x(Math.max(from, fromMs));
      const end = x(Math.min(to, toMs));
      if (end <= start) continue;
      const band = svg("rect", {class: "gap", x: start, y: upper, width: end - start, height: lower - upper});
      band.append(svg("title", {}, "not measured: the node had just started, had no leader or was catching up"));
      chart.append(band);
    }
    for (let index = 0; index * step <= top * (1 + 1e-9); index++) {
      const value = index * step;
      chart.append(
        svg("line", {class: index ? "grid" : "axis", x1: left, x2: right, y1: y(value), y2: y(value)}),
        svg("text", {class: "tick", x: left - 6, y: y(value) + 4, "text-anchor": "end"}, spec.format(value)),
      );
    }
    const {ticks, seconds} = timeTicks(fromMs, toMs);
    for (const atMs of ticks) {
      chart.append(
        svg("line", {class: "axis", x1: x(atMs), x2: x(atMs), y1: lower, y2: lower + 4}),
        svg("text", {class: "tick", x: x(atMs), y: lower + 16, "text-anchor": "middle"}, clockText(atMs, seconds)),
      );
    }
    const middle = (upper + lower) / 2;
    chart.append(svg("text", {
      class: "axis-title", x: 12, y: middle, "text-anchor": "middle", transform: `rotate(-90 12 ${middle})`,
    }, spec.yLabel));
    for (const one of series) {
      const path = svg("path", {
        class: `line series-${one.name}`, d: pathOf(one.points, x, y),
        "data-series": one.name, "data-points": counts.get(one.name),
        "data-max": Math.max(0, ...one.points.map(([, value]) => value).filter(Number.isFinite)),
      });
      path.append(svg("title", {}, one.label));
      chart.append(path);
    }
    if (!total) {
      chart.append(svg("text", {class: "empty", x: (left + right) / 2, y: middle, "text-anchor": "middle"}, spec.emptyText));
    }

    const caption = html("figcaption");
    caption.append(html("span", "chart-title", spec.title), legend({...spec, series}, counts));
    figure.replaceChildren(caption, chart);
    figure.dataset.state = total ? "drawn" : "empty";
    figure.dataset.points = String(total);
  }

  window.raftcronCharts = Object.freeze({lineChart, valueAxis, timeTicks});
})();
