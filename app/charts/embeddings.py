"""Token embeddings: a 2-D PCA of the sequence's input embeddings, and a token's nearest neighbours."""
from __future__ import annotations

import numpy as np

from .attention import SUBTITLE, SUBTITLE_PX, context_len, count_text, seq_events
from .common import LABEL_CHARS, empty, figure, label_px, layout, legend_key, plain, to_np
from ..i18n import texts

MAX_POINTS = 512
# Only the newest tokens carry a text label (every point has its token on hover): a hundred labels piled up
# into an unreadable cloud, and each one redrawn after every step cost the browser ~20 ms a step.
PCA_LABELS = 24
PROMPT_COLOR = "#4C78A8"
GENERATED_COLOR = "#F58518"


def _tr(lang: str) -> dict:
    return texts("emb", lang)


def _eigen_desc(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Eigenvalues (largest first, clipped at 0), their eigenvectors, and how many of the first two are nonzero."""
    evals, vecs = np.linalg.eigh(gram)
    order = np.argsort(evals)[::-1]
    evals, vecs = np.clip(evals[order], 0.0, None), vecs[:, order]
    return evals, vecs, int(min(2, np.count_nonzero(evals > 1e-12 * max(evals[0], 1e-300))))


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `x` projected on their first two principal components, and the explained-variance ratios.

    Centres the rows, takes the SVD; each component's sign is fixed so its largest-magnitude loading is
    positive (a stable orientation from step to step). Fewer than two components pad with zeros.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    coords, ratio = np.zeros((n, 2)), np.zeros(2)
    if n == 0:
        return coords, ratio
    xc = x - x.mean(axis=0, keepdims=True)
    # the principal axes from the smaller of the two Gram matrices (n×n for a sequence shorter than the
    # hidden size): the same components as an SVD at a fraction of its cost, which runs on every step
    if n <= xc.shape[1]:
        evals, u, k = _eigen_desc(xc @ xc.T)
        comps = (u[:, :k].T @ xc) / np.sqrt(evals[:k])[:, None] if k else np.zeros((0, xc.shape[1]))
    else:
        evals, v, k = _eigen_desc(xc.T @ xc)
        comps = v[:, :k].T.copy()
    for i in range(k):
        if comps[i, np.argmax(np.abs(comps[i]))] < 0:
            comps[i] = -comps[i]
    coords[:, :k] = xc @ comps.T
    total = float(evals.sum())
    if total > 0:
        ratio[:k] = evals[:k] / total
    return coords, ratio


def embedding_rows(events, seq_id: int) -> tuple[list[int], np.ndarray, int]:
    """(positions, embedding rows [n, hidden], prompt length) of the sequence, latest step per position."""
    evs = seq_events(events, seq_id)
    T = context_len(evs)
    rows: dict[int, np.ndarray] = {}
    n_prompt = evs[-1].prompt_len if evs else 0
    for s in evs:
        cap = s.capture
        if cap is None or cap.embeddings is None:
            continue
        emb = to_np(cap.embeddings)
        for i, p in enumerate(cap.positions):
            rows[int(p)] = emb[i]
    positions = sorted(p for p in rows if p < T)
    if not positions:
        return [], np.zeros((0, 0)), n_prompt
    return positions, np.stack([rows[p] for p in positions]), n_prompt


def embedding_pca(events, seq_id: int, texts: list[str] | None, lang: str = "en",
                  max_points: int = MAX_POINTS) -> dict:
    """Scatter of the sequence's input embeddings in 2-D (PCA), labelled with token text,
    prompt and generated tokens in two colours. Identical tokens share one embedding, so they coincide."""
    t = _tr(lang)
    uirev = "embedding-pca"
    positions, x, n_prompt = embedding_rows(events, seq_id)
    freed = _freed(events, seq_id, positions)
    note = t["freed"].format(n=count_text(freed, lang)) if freed else ""
    if not positions:
        return empty(t["pca_title"].format(n=0), note or t["pca_empty"], uirev)
    positions, x = positions[-int(max_points):], x[-int(max_points):]
    coords, ratio = pca_2d(x)
    coords = np.round(coords, 5)
    data = []
    for name, color, keep in ((t["prompt"], PROMPT_COLOR, lambda p: p < n_prompt),
                              (t["generated"], GENERATED_COLOR, lambda p: p >= n_prompt)):
        idx = [i for i, p in enumerate(positions) if keep(p)]
        if not idx:
            continue
        labels = [plain(texts[positions[i]]) if texts is not None and positions[i] < len(texts) else ""
                  for i in idx]
        newest = len(positions) - PCA_LABELS
        data.append(dict(
            type="scatter", mode="markers+text", name=name,
            x=coords[idx, 0], y=coords[idx, 1], customdata=[[positions[i]] for i in idx], hovertext=labels,
            text=[lab if i >= newest else "" for lab, i in zip(labels, idx)],
            # a point at the plot's edge keeps its label whole (the plot area would cut it)
            textposition="top center", textfont=dict(size=10, color=color), cliponaxis=False,
            marker=dict(color=color, size=8, line=dict(color="white", width=1)),
            hovertemplate=f"{t['position']} %{{customdata[0]}} · %{{hovertext}}<br>"
                          f"PC1 %{{x:.3f}}, PC2 %{{y:.3f}}<extra>{name}</extra>"))
    title = (t["pca_title"].format(n=len(positions)) + "<br><span style='font-size:11px;color:#555'>"
             + t["pca_labels"].format(k=min(PCA_LABELS, len(positions))) + "</span>")
    if note:
        title += SUBTITLE.format(note)
    lay = layout(title, uirev,
                 xaxis=dict(title=dict(text=t["pc"].format(k=1, pct=100 * ratio[0])), zeroline=False,
                            showgrid=True, gridcolor="#eee"),
                 yaxis=dict(title=dict(text=t["pc"].format(k=2, pct=100 * ratio[1])), zeroline=False,
                            showgrid=True, gridcolor="#eee"),
                 annotations=[legend_key([[("●", PROMPT_COLOR, t["prompt"]), ("●", GENERATED_COLOR, t["generated"])]])],
                 margin=dict(l=50, r=20, t=80 + (SUBTITLE_PX if note else 0), b=40))
    return figure(data, lay)


def _freed(events, seq_id: int, shown: list[int]) -> int:
    """How many computed positions lost their embedding row to SeqEvent.drop_capture (not recomputed since)."""
    evs = seq_events(events, seq_id)
    T, have = context_len(evs), set(shown)
    out = {int(p) for s in evs if s.capture is not None and "embeddings" in (s.capture.dropped or ())
           for p in s.capture.positions}
    return len([p for p in out if p < T and p not in have])


def neighbours_chart(neighbours: list[tuple[int, str, float]], token_text: str, lang: str = "en") -> dict:
    """Horizontal bars of cosine similarity, closest on top; input is Engine.nearest_tokens(token_id, k)."""
    t = _tr(lang)
    uirev = "embedding-neighbours"
    title = t["nb_title"].format(tok=f"«{plain(token_text)}»")
    if not neighbours:
        return empty(title, t["nb_empty"], uirev)
    ids = [int(i) for i, _, _ in neighbours]
    # the id keeps labels unique; the text is cut so that a fixed margin holds every label (common.LABEL_CHARS:
    # the neighbours change with each new token, and a margin sized to them would redraw the chart twice)
    labels = [f"{plain(text, LABEL_CHARS)}  #{i}" for i, text, _ in neighbours]
    hovers = [f"{plain(text)}  #{i}" for i, text, _ in neighbours]
    cos = [float(c) for _, _, c in neighbours]
    trace = dict(type="bar", orientation="h", x=cos, y=labels, customdata=ids, marker=dict(color=PROMPT_COLOR),
                 # inside the bar, at its end: "auto" tries both sides of each bar, measuring the text each time
                 texttemplate="%{x:.3f}", textposition="inside", insidetextanchor="end", hovertext=hovers,
                 hovertemplate=f"%{{hovertext}}<br>{t['cosine']}: %{{x:.4f}}<extra></extra>")
    lo = min(0.0, min(cos))
    lay = layout(title, uirev,
                 xaxis=dict(title=dict(text=t["cosine"]), range=[lo, 1.0], showgrid=True, gridcolor="#eee"),
                 yaxis=dict(title=dict(text=t["token"]), type="category", autorange="reversed",
                            tickfont=dict(size=11)),
                 margin=dict(l=label_px(11, LABEL_CHARS + 8) + 24, r=20, t=40, b=50),
                 height=max(260, 24 * len(labels) + 90))
    return figure([trace], lay)
