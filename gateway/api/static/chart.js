// A small line chart on a <canvas>: no library, so the dashboard works offline.
// lineChart(canvas, times, series, options): times are unix seconds, each series is
// {name, values, color}; a null value leaves a gap. The canvas records how many points
// it drew in data-points (the browser test reads it).
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function formatValue(value, unit) {
  if (unit === "%") return (value * 100).toFixed(0) + "%";
  if (unit === "$") {
    if (value === 0 || value >= 1) return "$" + value.toFixed(2);
    return "$" + (value >= 0.01 ? value.toFixed(3) : value.toExponential(1));
  }
  if (unit === "s") return value >= 1 ? value.toFixed(1) + "s" : (value * 1000).toFixed(0) + "ms";
  return value >= 100 ? value.toFixed(0) : value.toPrecision(2);
}

function lineChart(canvas, times, series, options = {}) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const pad = {left: 52, right: 10, top: 22, bottom: 22};
  const plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
  const values = series.flatMap((s) => s.values.filter((v) => v !== null && isFinite(v)));
  const top = options.max !== undefined ? options.max : niceMax(Math.max(0, ...values));
  const t0 = times.length ? times[0] : 0, t1 = times.length ? times[times.length - 1] : 1;
  const x = (t) => pad.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) * plotW : plotW);
  const y = (v) => pad.top + plotH - (v / top) * plotH;

  ctx.font = "11px sans-serif";
  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  ctx.textAlign = "right";
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    ctx.beginPath();
    ctx.moveTo(pad.left, y(v));
    ctx.lineTo(width - pad.right, y(v));
    ctx.stroke();
    ctx.fillText(formatValue(v, options.unit), pad.left - 4, y(v) + 4);
  }
  if (times.length > 1) {
    ctx.textAlign = "left";
    ctx.fillText(new Date(t0 * 1000).toLocaleTimeString(), pad.left, height - 6);
    ctx.textAlign = "right";
    ctx.fillText(new Date(t1 * 1000).toLocaleTimeString(), width - pad.right, height - 6);
  }

  let drawn = 0;
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let open = false;
    s.values.forEach((v, j) => {
      if (v === null || !isFinite(v)) { open = false; return; }
      if (open) ctx.lineTo(x(times[j]), y(v)); else ctx.moveTo(x(times[j]), y(v));
      open = true;
      drawn++;
    });
    ctx.stroke();
    // One point alone draws no line: mark the last value so it shows.
    const last = s.values.length - 1;
    if (last >= 0 && s.values[last] !== null && isFinite(s.values[last])) {
      ctx.beginPath();
      ctx.arc(x(times[last]), y(s.values[last]), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    }
    ctx.textAlign = "left";
    ctx.fillText(s.name, pad.left + 6 + i * 90, 13);
  });
  if (!values.length) {
    ctx.fillStyle = "#9ca3af";
    ctx.textAlign = "center";
    ctx.fillText("no data yet", pad.left + plotW / 2, pad.top + plotH / 2);
  }
  canvas.dataset.points = String(drawn);
}

window.lineChart = lineChart;
