"""The ROSE page of the scheduler's Dask dashboard: http://SCHEDULER:8787/rose

Per rollout worker: role, slots, sequences and tasks in flight, weight version, dispatches and shed
events; over time: each worker's slots and sequences in use, and each serving worker's SLO attainment
(per sampling window, from the requests its HTTP front end completed). Below: the placement plugin's
warnings, error count and recent events. `register()` runs when the preload `rose.plugin` is
imported, which a scheduler does before it starts its dashboard; the page needs bokeh (as Dask's
dashboard does).
"""
from __future__ import annotations

import time

from rose.runtime.scheduler.plugin import get_plugin

WINDOW_S = 300.0  # seconds of history in the time series
COLUMNS = [("address", "worker"), ("role", "role"), ("slots", "slots"), ("used", "seqs in use"),
           ("inflight", "tasks in flight"), ("weight_version", "weights"), ("dispatched", "dispatched"),
           ("shed", "shed"), ("slo", "SLO attainment")]


def _attainment_series(history, now: float) -> dict[str, tuple[list, list]]:
    """Per serving worker: (times, attainment per sample interval) from cumulative (met, requests)."""
    last: dict[str, tuple[int, int]] = {}
    out: dict[str, tuple[list, list]] = {}
    for t, addr, role, _slots, _used, met, reqs in history:
        if role != "serving" or met is None or reqs is None:
            continue
        if addr in last and now - t <= WINDOW_S:
            m0, r0 = last[addr]
            if reqs > r0:
                xs, ys = out.setdefault(addr, ([], []))
                xs.append((t - now))
                ys.append((met - m0) / (reqs - r0))
        if addr not in last or reqs - last[addr][1] >= 20 or now - t > WINDOW_S:
            last[addr] = (met, reqs)  # windows of at least 20 requests
    return out


def rose_doc(scheduler, extra, doc):
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, DataTable, Div, Legend, TableColumn
    from bokeh.palettes import Category10
    from bokeh.plotting import figure
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    header = Div(sizing_mode="stretch_width")
    table_src = ColumnDataSource({k: [] for k, _ in COLUMNS})
    table = DataTable(source=table_src, columns=[TableColumn(field=k, title=t) for k, t in COLUMNS],
                      height=180, sizing_mode="stretch_width", index_position=None)
    cap = figure(title="rollout slots (dashed) and sequences in use (solid), per worker", height=260,
                 sizing_mode="stretch_width", x_axis_label="seconds ago", tools="", toolbar_location=None)
    slo = figure(title="serving SLO attainment (per window of >= 20 requests)", height=220, y_range=(0, 1.05),
                 sizing_mode="stretch_width", x_axis_label="seconds ago", tools="", toolbar_location=None)
    for fig in (cap, slo):
        fig.add_layout(Legend(), "right")
    events = Div(sizing_mode="stretch_width")
    lines: dict[tuple[str, str], ColumnDataSource] = {}
    palette = Category10[10]

    def source(fig, key: tuple[str, str], label: str, color: str, dash: str = "solid") -> ColumnDataSource:
        if key not in lines:
            lines[key] = ColumnDataSource({"x": [], "y": []})
            fig.line("x", "y", source=lines[key], line_color=color, line_dash=dash, line_width=2,
                     legend_label=label)
        return lines[key]

    def update():
        plugin = get_plugin(scheduler)
        if plugin is None:
            header.text = "<p>This scheduler runs without the ROSE placement plugin " \
                          "(<code>dask scheduler --preload rose.plugin</code>).</p>"
            return
        st = plugin.state()
        now = time.monotonic()  # the placement book's clock
        rollout = {a: w for a, w in st["workers"].items() if w["role"] in ("dedicated", "serving")}
        warn = f"<p style='color:#b00'><b>warning:</b> {st['warning']}</p>" if st["warning"] else ""
        err = (f"<p style='color:#b00'><b>{st['errors']} plugin errors</b>; last: {st['last_error']}</p>"
               if st["errors"] else "")
        refused = "".join(f"<p style='color:#b00'>refused {a}: {why}</p>" for a, why in st["refused"].items())
        header.text = (f"<h3>ROSE placement</h3><p>policy <b>{st['policy']}</b> &middot; {len(rollout)} rollout "
                       f"workers &middot; {st['parked']} rollout tasks waiting &middot; {st['managed']} managed"
                       f"</p>{warn}{err}{refused}")
        table_src.data = {
            "address": list(rollout),
            "role": [w["role"] + (" (on demand)" if w["elastic"] else "") for w in rollout.values()],
            "slots": [w["slots"] for w in rollout.values()],
            "used": [w["used"] for w in rollout.values()],
            "inflight": [w["inflight"] for w in rollout.values()],
            "weight_version": [w["weight_version"] for w in rollout.values()],
            "dispatched": [w["dispatched"] for w in rollout.values()],
            "shed": [w["shed"] for w in rollout.values()],
            "slo": [f"{w['slo_met'] / w['slo_requests']:.4f}" if w.get("slo_requests") else "-"
                    for w in rollout.values()],
        }
        series: dict[str, dict[str, list]] = {}
        for t, addr, _role, slots, used, _met, _reqs in plugin.book.history:
            if now - t <= WINDOW_S:
                s = series.setdefault(addr, {"x": [], "slots": [], "used": []})
                s["x"].append(t - now)
                s["slots"].append(slots)
                s["used"].append(used)
        for i, (addr, s) in enumerate(sorted(series.items())):
            color = palette[i % len(palette)]
            name = addr.rsplit(":", 1)[-1]
            role = rollout.get(addr, {}).get("role", "gone")
            source(cap, (addr, "slots"), f"{role} :{name} slots", color, "dashed").data = {"x": s["x"], "y": s["slots"]}
            source(cap, (addr, "used"), f"{role} :{name} in use", color).data = {"x": s["x"], "y": s["used"]}
        for i, (addr, (xs, ys)) in enumerate(sorted(_attainment_series(plugin.book.history, now).items())):
            source(slo, (addr, "slo"), f"serving :{addr.rsplit(':', 1)[-1]}", palette[(i + 3) % 10]).data = \
                {"x": xs, "y": ys}
        rows = "".join(f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(t))}</td><td>{kind}</td><td>{addr}</td>"
                       f"<td>{detail}</td></tr>" for t, kind, addr, detail, _sid in reversed(st["events"][-15:]))
        events.text = f"<h4>recent events</h4><table>{rows}</table>"

    update()
    doc.add_periodic_callback(update, 500)
    doc.title = "Dask: ROSE"
    doc.add_root(column(header, table, row(cap, sizing_mode="stretch_width"),
                        row(slo, sizing_mode="stretch_width"), events, sizing_mode="stretch_width"))
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def register() -> bool:
    """Add /rose to the dashboard's pages (before the scheduler starts its dashboard)."""
    try:
        from distributed.dashboard.scheduler import applications
    except ImportError:  # no bokeh: Dask runs without a dashboard, and so does this page
        return False
    applications.setdefault("/rose", rose_doc)
    return True
