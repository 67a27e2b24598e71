"""Draw docs/img/streaming_path.png: the path of one token from vLLM to the framework stream.

python docs/img/streaming_path.py      (needs matplotlib)
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BOXES = {
    # name: (x, y, w, h, title, body, colour)
    "core": (
        0.3,
        4.0,
        3.3,
        1.5,
        "vLLM engine core",
        "its own process\nscheduler + model\ncontinuous batching",
        "#fde2c8",
    ),
    "async": (
        4.4,
        4.0,
        3.4,
        1.5,
        "AsyncLLM.generate()",
        "SamplingParams(output_kind=DELTA)\none RequestOutput per step:\nonly the new text + token ids",
        "#fde2c8",
    ),
    "engine": (
        8.6,
        4.0,
        3.4,
        1.5,
        "stream/generate.py",
        "on the engine's loop thread:\nrender, sampling, parsers\n-> Delta",
        "#d5e8f7",
    ),
    "bridge": (
        6.5,
        2.1,
        3.4,
        1.3,
        "loop/bridge.py",
        "aiter_on / iter_on hand each Delta\nto the caller's event loop or\nthread as it comes",
        "#d5e8f7",
    ),
    "lc": (
        4.4,
        0.2,
        3.4,
        1.3,
        "LangChain: ChatVLLM",
        "_astream / _stream\nDelta -> AIMessageChunk",
        "#dff2d8",
    ),
    "li": (
        8.6,
        0.2,
        3.4,
        1.3,
        "LlamaIndex: VLLM",
        "astream_chat / stream_chat\nDelta -> ChatResponse(delta=...)",
        "#dff2d8",
    ),
}


def main() -> None:
    fig, ax = plt.subplots(figsize=(12.4, 7.0), dpi=110)
    ax.set_xlim(0, 12.3)
    ax.set_ylim(-0.5, 6.6)
    ax.axis("off")
    ax.text(
        6.15,
        6.35,
        "How a token streams in vllm-inline: one Python process, no HTTP hop",
        ha="center",
        va="center",
        fontsize=15,
        weight="bold",
    )
    # Process boundaries: the engine core is vLLM's own child process; the rest is the app's.
    ax.add_patch(
        FancyBboxPatch(
            (0.15, 3.8),
            3.6,
            1.95,
            boxstyle="round,pad=0.05",
            fill=False,
            ls="--",
            lw=1.4,
            ec="#555",
        )
    )
    ax.text(
        1.95, 3.55, "engine-core process", ha="center", fontsize=9.5, color="#444", style="italic"
    )
    ax.add_patch(
        FancyBboxPatch(
            (4.2, 0.0),
            7.95,
            5.75,
            boxstyle="round,pad=0.05",
            fill=False,
            ls="--",
            lw=1.4,
            ec="#555",
        )
    )
    ax.text(
        8.15,
        -0.35,
        "your application's process (LangChain / LlamaIndex / FastAPI ...)",
        ha="center",
        fontsize=10,
        color="#444",
        style="italic",
    )
    for x, y, w, h, title, body, colour in BOXES.values():
        ax.add_patch(
            FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.06", fc=colour, ec="#333", lw=1.2)
        )
        ax.text(
            x + w / 2, y + h - 0.28, title, ha="center", va="center", fontsize=11.5, weight="bold"
        )
        ax.text(
            x + w / 2,
            y + (h - 0.45) / 2,
            body,
            ha="center",
            va="center",
            fontsize=9.5,
            linespacing=1.35,
        )

    def arrow(a, b, label="", label_xy=None):
        ax.add_patch(
            FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=20, lw=1.8, color="#222")
        )
        if label:
            ax.text(*label_xy, label, ha="center", va="center", fontsize=9, color="#1a4f8b")

    arrow((3.65, 4.75), (4.35, 4.75), "IPC", (4.0, 5.0))
    arrow((7.85, 4.75), (8.55, 4.75))
    arrow((10.3, 3.95), (9.4, 3.45), "Delta(text, reasoning,\ntool_calls, usage)", (11.2, 3.3))
    arrow((7.4, 2.05), (6.6, 1.55))
    arrow((9.0, 2.05), (9.8, 1.55))
    ax.text(
        8.2,
        1.75,
        "one shared engine\n(get_engine)",
        ha="center",
        va="center",
        fontsize=8.5,
        color="#1a4f8b",
    )
    ax.text(
        1.95,
        1.3,
        "ChatOpenAI -> vllm serve instead:\nJSON + SSE over HTTP between\nthe app and a second server\n"
        "that you run and keep alive",
        ha="center",
        va="center",
        fontsize=9.5,
        color="#8b1a1a",
        bbox={"boxstyle": "round", "fc": "#fbeaea", "ec": "#8b1a1a"},
    )
    out = Path(__file__).with_suffix(".png")
    fig.savefig(out, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main()
