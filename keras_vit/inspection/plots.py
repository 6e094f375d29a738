"""Matplotlib figures for :mod:`keras_vit.inspection` (paper Figures 6 and 7), saved as PNG.

Figures are drawn on a bare :class:`matplotlib.figure.Figure` (Agg canvas, no
pyplot state, no GUI) and written atomically: to a temporary file in the target
folder, then moved into place with :func:`os.replace`, so a failed or
interrupted save never leaves a half-written PNG.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.fileio import atomic_write


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path, dpi=100):
    """Write ``fig`` to ``path`` as PNG atomically; returns the path."""
    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise ValueError(f"figures are saved as PNG: path must end in '.png', got {path!r}")
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return path


def _display_images(images):
    arr = np.asarray(images, dtype=np.float64)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3):
        raise ValueError(f"images must be (H, W, 3) or (B, H, W, 3) in [0, 1], got {np.shape(images)}")
    return np.clip(arr, 0.0, 1.0)


def plot_rollout(images, maps, path, title="Attention rollout (output token -> input)"):
    """Attention-rollout overlay, like paper Figure 6: per image, the input, the map as a
    heat overlay, and the input weighted by the map.

    Args:
        images: ``(H, W, 3)`` or ``(B, H, W, 3)`` RGB in [0, 1].
        maps: ``(H, W)`` or ``(B, H, W)`` maps in [0, 1] at image resolution
            (:func:`keras_vit.inspection.upsample_map` with ``normalize=True``).
        path: PNG path.
    """
    imgs = _display_images(images)
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim == 2:
        maps = maps[None]
    if maps.shape != imgs.shape[:3]:
        raise ValueError(f"maps {maps.shape} must match the images' (B, H, W) {imgs.shape[:3]}")
    n = imgs.shape[0]
    fig = _figure((9, 3.1 * n + 0.4))
    axes = fig.subplots(n, 3, squeeze=False)
    for i in range(n):
        img, m = imgs[i], maps[i]
        axes[i, 0].imshow(img)
        axes[i, 1].imshow(img)
        shown = axes[i, 1].imshow(m, cmap="inferno", alpha=0.6, vmin=0.0, vmax=1.0)
        axes[i, 2].imshow(img * m[..., None])
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_title("Input")
    axes[0, 1].set_title("Rollout overlay")
    axes[0, 2].set_title("Input x attention")
    fig.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="rollout (rescaled to [0, 1])")
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_attention_distance(distances, path, image_size=None,
                            title="Mean attention distance by head and depth", uniform=None):
    """Scatter of mean attention distance (pixels) against layer, one colour per head
    (paper Figure 7 right / Figure 11).

    Args:
        distances: ``(layers, heads)`` from :func:`keras_vit.inspection.mean_attention_distance`.
        path: PNG path.
        image_size: image width in pixels; sets the y range to ``[0, width]`` and is
            noted in the title.
        uniform: if given, the distance that uniform attention over all patches would
            give, drawn as a dashed reference line.
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"distances must be (layers, heads), got {d.shape}")
    layers, heads = d.shape
    fig = _figure((6, 4.5))
    ax = fig.subplots()
    cmap = __import__("matplotlib").colormaps["tab20" if heads > 10 else "tab10"]
    depth = np.arange(1, layers + 1)
    for h in range(heads):
        jitter = (h - (heads - 1) / 2) * min(0.5 / max(heads, 1), 0.04)
        ax.scatter(depth + jitter, d[:, h], s=22, color=cmap(h % cmap.N), label=f"Head {h + 1}",
                   edgecolors="none")
    if uniform is not None:
        ax.axhline(uniform, color="0.5", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if layers <= 24 else depth[:: max(1, layers // 12)])
    top = image_size if image_size else (np.nanmax(d) * 1.1 if np.isfinite(d).any() else 1.0)
    ax.set_ylim(0, top)
    ax.set_xlim(0.5, layers + 0.5)
    ax.grid(alpha=0.3)
    if heads <= 16 or uniform is not None:
        ax.legend(fontsize=7, ncol=2 if heads > 8 else 1, loc="lower right", markerscale=0.8)
    suffix = f" (image width {image_size} px)" if image_size else ""
    ax.set_title(title + suffix, fontsize=10)
    return save_figure(fig, path)


def plot_position_similarity(similarity, path, title="Position embedding similarity"):
    """Grid of tiles like paper Figure 7 (centre): tile (r, c) shows the cosine similarity of
    the position embedding of patch (r, c) with those of all patches.

    Args:
        similarity: ``(gh, gw, gh, gw)`` from
            :func:`keras_vit.inspection.position_embedding_similarity`.
        path: PNG path.
    """
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 4 or s.shape[:2] != s.shape[2:]:
        raise ValueError(f"similarity must be (gh, gw, gh, gw), got {s.shape}")
    gh, gw = s.shape[:2]
    side = min(8.0, 0.55 * max(gh, gw) + 1.5)
    fig = _figure((side * gw / max(gh, gw) + 1.0, side * gh / max(gh, gw) + 0.6))
    fig.get_layout_engine().set(w_pad=0.01, h_pad=0.01, wspace=0.02, hspace=0.02)
    axes = fig.subplots(gh, gw, squeeze=False)
    shown = None
    for r in range(gh):
        for c in range(gw):
            ax = axes[r, c]
            shown = ax.imshow(s[r, c], cmap="viridis", vmin=-1.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(str(r + 1), rotation=0, labelpad=8, fontsize=7, va="center")
            if r == gh - 1:
                ax.set_xlabel(str(c + 1), fontsize=7)
    fig.supxlabel("Input patch column", fontsize=9)
    fig.supylabel("Input patch row", fontsize=9)
    fig.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.04, pad=0.02, label="Cosine similarity")
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def plot_embedding_filters(filters, path, title="RGB embedding filters (first principal components)",
                           columns=7, variance=None):
    """Grid of the principal components of the patch embedding (paper Figure 7 left).

    Args:
        filters: ``(k, P, P, C)`` in [0, 1] from :func:`keras_vit.inspection.embedding_filters`.
        path: PNG path.
        variance: optional ``(k,)`` explained-variance ratios, printed under each filter.
    """
    f = np.asarray(filters, dtype=np.float64)
    if f.ndim != 4 or f.shape[-1] not in (1, 3):
        raise ValueError(f"filters must be (k, P, P, 3) or (k, P, P, 1), got {f.shape}")
    k = f.shape[0]
    cols = min(columns, k)
    rows = -(-k // cols)
    fig = _figure((1.1 * cols + 0.4, 1.1 * rows + 0.6))
    fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, wspace=0.03, hspace=0.03)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.set_xticks([])
        ax.set_yticks([])
        if i < k:
            img = np.clip(f[i], 0.0, 1.0)
            ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None,
                      vmin=0.0, vmax=1.0, interpolation="nearest")
            if variance is not None:
                ax.set_xlabel(f"{100 * variance[i]:.1f}%", fontsize=7, labelpad=2)
        else:
            ax.axis("off")
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
