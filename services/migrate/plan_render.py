"""`dralloc plan`'s output: a table for people, the chart for a slide (matplotlib, the `plot` extra)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

TOP = 10
"""Workloads listed as driving the difference."""


def table(result: dict, console: Console) -> None:
    """The comparison, then the workloads that save the most."""
    summary = Table(
        title=f"dralloc plan: {result['workloads']} workloads, {result['pods']} pods on {result['fleet_nodes']} nodes ({result['fleet_gpus']} GPUs)",
        header_style="bold",
    )
    summary.add_column("")
    summary.add_column("device plugin", justify="right")
    summary.add_column("DRA (dralloc)", justify="right")
    summary.add_column("saved", justify="right")
    summary.add_row("GPUs needed", str(result["device_plugin_gpus"]), str(result["dra_gpus"]), str(result["gpus_saved"]))
    summary.add_row("nodes used", str(result["device_plugin_nodes"]), str(result["dra_nodes"]), str(result["device_plugin_nodes"] - result["dra_nodes"]))
    summary.add_row("pods that did not fit", str(result["not_fitted_device_plugin"]), str(result["not_fitted_dra"]), "")
    summary.add_row("pods on MIG slices", "0", str(result["dra_pods_on_mig"]), "")
    summary.add_row("pods on GPU shares", "0", str(result["dra_pods_on_shares"]), "")
    console.print(summary)
    drivers = [d for d in result["drivers"] if d["saved"]][:TOP]
    if not drivers:
        console.print("No workload uses fewer GPUs under DRA (no MIG asks, no right-sizing data).")
        return
    top = Table(title="Workloads driving the difference (GPU-equivalents: a MIG slice counts Ng/7, a share its memory fraction)", header_style="bold")
    for column in ("workload", "pods", "device plugin", "DRA", "saved", "why"):
        top.add_column(column, justify="right" if column in ("pods", "device plugin", "DRA", "saved") else "left")
    for d in drivers:
        top.add_row(d["workload"], str(d["pods"]), f"{d['device_plugin_gpus']:g}", f"{d['dra_gpus']:g}", f"{d['saved']:g}", d["why"])
    console.print(top)
    seconds = result["seconds"]
    console.print(
        f"planned in {seconds['total']:.1f} s (reading and migrating {seconds['read_and_migrate']:.1f} s; device plugin "
        f"{seconds['device_plugin_fleet'] + seconds['device_plugin_allocate']:.1f} s; DRA fleet {seconds['dra_fleet']:.1f} s, "
        f"allocation {seconds['dra_allocate']:.1f} s)"
    )


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def chart(result: dict, path: str, fmt: str) -> None:
    """GPUs and nodes per mode, and the top workloads by GPUs saved, as one PNG or SVG."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("charts need matplotlib: pip install 'dralloc[plot]'") from None
    drivers = [d for d in result["drivers"] if d["saved"] > 0][:TOP]
    fig, axes = plt.subplots(1, 2 if drivers else 1, figsize=(13 if drivers else 6, 5), squeeze=False)
    left = axes[0][0]
    modes = ["device plugin", "DRA (dralloc)"]
    gpus = [result["device_plugin_gpus"], result["dra_gpus"]]
    nodes = [result["device_plugin_nodes"], result["dra_nodes"]]
    x = range(len(modes))
    bars = left.bar([i - 0.2 for i in x], gpus, width=0.4, label="GPUs", color=["#9e9e9e", "#76b900"])
    node_bars = left.bar([i + 0.2 for i in x], nodes, width=0.4, label="nodes", color=["#cfcfcf", "#b5e06a"])
    left.bar_label(bars)
    left.bar_label(node_bars)
    left.set_xticks(list(x), modes)
    left.set_title(f"{result['gpus_saved']} GPUs saved for {result['workloads']} workloads ({result['pods']} pods)")
    left.legend()
    if result["not_fitted_device_plugin"] or result["not_fitted_dra"]:
        left.text(
            0.5,
            -0.12,
            f"did not fit: {result['not_fitted_device_plugin']} pods (device plugin), {result['not_fitted_dra']} (DRA)",
            transform=left.transAxes,
            ha="center",
        )
    if drivers:
        right = axes[0][1]
        names = [d["workload"] for d in reversed(drivers)]
        colors = {"MIG slices": "#76b900", "GPU shares": "#1f77b4", "MIG slices and GPU shares": "#17becf"}
        right.barh(names, [d["saved"] for d in reversed(drivers)], color=[colors.get(d["why"], "#9e9e9e") for d in reversed(drivers)])
        from matplotlib.patches import Patch

        shown = [w for w in colors if any(d["why"] == w for d in drivers)]
        right.legend(handles=[Patch(color=colors[w], label=w) for w in shown], loc="lower right")
        right.set_title(f"GPU-equivalents saved, by workload\n({result['dra_pods_on_mig']} pods on MIG slices, {result['dra_pods_on_shares']} on GPU shares)")
        right.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)
