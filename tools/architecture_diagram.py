"""Write docs/images/architecture.svg: one request through Scorer -> Selector -> Backend, and the layers.

The picture the README and the docs embed (an ASCII diagram is cut off on narrow screens). Plain
SVG written by hand from the tables below, so a change to the architecture is a change to this
file's lists; run it again and commit both::

    python tools/architecture_diagram.py            # rewrites docs/images/architecture.svg
"""

from __future__ import annotations

import argparse
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "architecture.svg"

WIDTH = 760
FONT = "Roboto, 'Helvetica Neue', Arial, 'DejaVu Sans', sans-serif"
MONO = "'Roboto Mono', Menlo, Consolas, 'DejaVu Sans Mono', monospace"
INK = "#1f2937"
MUTED = "#4b5563"

#: The request's stages: (title, call, implementations, what it returns or holds).
STAGES = [
    (
        "Prompt",
        "build_prompt",
        ["messages or text,", "target tokenizer,", "chat template"],
        ["ids, roles,", "protected mask"],
    ),
    (
        "Scorer",
        "score(prompt)",
        ["DraftAttentionScorer", "look-ahead N,", "first L layers;", "baselines"],
        ["TokenScores:", "a float per token"],
    ),
    (
        "Selector",
        "select(...)",
        ["KeepRate, Chunked,", "Protect, Adaptive,", "TokenBudget,", "DenseBelow"],
        ["Selection:", "kept indices"],
    ),
    (
        "CompressedPrompt",
        "",
        ["kept ids at their", "original positions;", "decoding continues", "at position n"],
        ["ids, positions, n"],
    ),
    (
        "Backend",
        "generate/stream",
        ["TransformersBackend", "VLLMBackend", "OpenAIBackend"],
        ["Completion: text,", "usage, timings"],
    ),
]
STAGE_COLORS = [
    ("#f3f4f6", "#9ca3af"),
    ("#e0e7ff", "#4f46e5"),
    ("#dcfce7", "#16a34a"),
    ("#f3f4f6", "#9ca3af"),
    ("#fef3c7", "#d97706"),
]

#: The layers, top to bottom: (name, one line on the rule, modules).
LAYERS = [
    (
        "entry points",
        "know the pipeline and the drivers, never each other's insides",
        [
            "cli/  run · serve · eval",
            "server/",
            "eval/",
            "adapters  LangChain · LlamaIndex · litellm",
        ],
    ),
    (
        "drivers",
        "build or drive pipelines",
        ["policies  presets, registries", "conversation", "textmode", "components"],
    ),
    ("pipeline", "compress_prompts: score -> fallback -> select", ["Pipeline(scorer, selector, backend)"]),
    (
        "stages",
        "implement the interfaces, never import the pipeline",
        ["scoring/", "selection/", "backends/  transformers · vllm · openai"],
    ),
    (
        "runtime",
        "fast passes shared by draft and backend",
        ["lean layers · fused norms · attention · ExecutionSettings"],
    ),
    (
        "floor",
        "",
        ["types · interfaces · errors · validation", "prompt · models · rendering · cost · tracing/"],
    ),
]
LAYER_COLORS = ["#ede9fe", "#e0f2fe", "#e0e7ff", "#dcfce7", "#fef9c3", "#f3f4f6"]


def text(x: float, y: float, s: str, size: int = 13, weight: str = "normal", color: str = INK, **kw: str) -> str:
    anchor = kw.pop("anchor", "middle")
    family = kw.pop("family", FONT)
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-family="{family}" font-size="{size}" font-weight="{weight}" '
        f'fill="{color}" text-anchor="{anchor}"{extra}>{escape(s)}</text>'
    )


def rect(x: float, y: float, w: float, h: float, fill: str, stroke: str, r: int = 8, dash: str = "") -> str:
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{r}" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="1.5"{d}/>'
    )


def arrow(x1: float, y1: float, x2: float, y2: float, color: str = MUTED) -> str:
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="2" '
        'marker-end="url(#head)"/>'
    )


def _chip_parts(module: str) -> tuple[str, str]:
    """A chip's package name (set in mono when it is a folder) and the words after it."""
    name, _, rest = module.partition("  ")
    return name, rest


def _is_folder(name: str) -> bool:
    return name.endswith("/") and " " not in name


def _chip_width(module: str) -> float:
    name, rest = _chip_parts(module)
    return (7.3 if _is_folder(name) else 6.2) * len(name) + (6.2 * (len(rest) + 2) if rest else 0) + 22


def _chip_text(x: float, y: float, module: str) -> str:
    name, rest = _chip_parts(module)
    family = MONO if _is_folder(name) else FONT
    words = f'<tspan fill="{MUTED}" font-family="{FONT}">  {escape(rest)}</tspan>' if rest else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="12" fill="{INK}" text-anchor="middle" xml:space="preserve">'
        f'<tspan font-family="{family}">{escape(name)}</tspan>{words}</text>'
    )


def request_panel(top: float) -> tuple[list[str], float]:
    """The five stages left to right, the Pipeline bracket under the three it chains."""
    out = [text(24, top + 20, "One request", 17, "bold", anchor="start")]
    out.append(
        text(
            24,
            top + 42,
            "the draft scores every prompt token; the target prefills the kept ones at their original positions",
            13,
            color=MUTED,
            anchor="start",
        )
    )
    gap, left = 18.0, 24.0
    w = (WIDTH - 2 * left - gap * (len(STAGES) - 1)) / len(STAGES)
    y, h = top + 62, 172.0
    for i, ((title, call, impls, holds), (fill, stroke)) in enumerate(zip(STAGES, STAGE_COLORS, strict=True)):
        x = left + i * (w + gap)
        out.append(rect(x, y, w, h, fill, stroke))
        cx = x + w / 2
        out.append(text(cx, y + 22, title, 12.5 if len(title) > 12 else 15, "bold"))
        if call:
            out.append(text(cx, y + 40, call, 11, color=MUTED, family=MONO))
        rule = f'x1="{x + 10:.1f}" y1="{y + 50:.1f}" x2="{x + w - 10:.1f}" y2="{y + 50:.1f}"'
        out.append(f'<line {rule} stroke="{stroke}" stroke-opacity="0.5"/>')
        for j, impl in enumerate(impls):
            out.append(text(cx, y + 68 + 15 * j, impl, 10.5))
        for j, line in enumerate(holds):
            out.append(text(cx, y + h - 12 - 13 * (len(holds) - 1 - j), line, 10, color=MUTED, font_style="italic"))
        if i:
            out.append(arrow(x - gap + 1, y + h / 2, x - 2, y + h / 2))
    # Pipeline bracket under Scorer .. Backend
    x0 = left + (w + gap)
    x1 = left + 4 * (w + gap) + w
    by = y + h + 14
    out.append(f'<path d="M{x0:.1f},{by:.1f} v8 H{x1:.1f} v-8" fill="none" stroke="{MUTED}" stroke-width="1.5"/>')
    out.append(text((x0 + x1) / 2, by + 28, "Pipeline(scorer, selector, backend)", 13, "bold", family=MONO))
    out.append(
        text(
            (x0 + x1) / 2,
            by + 46,
            "generate · stream · async · batch · conversation; a scorer error falls back to dense prefill",
            12,
            color=MUTED,
        )
    )
    return out, by + 60


def layers_panel(top: float) -> tuple[list[str], float]:
    """The layer bands, top to bottom, with their modules as chips; imports point down."""
    out = [text(24, top + 20, "Layers", 17, "bold", anchor="start")]
    out.append(
        text(
            24,
            top + 42,
            "a module imports its own layer and those below (tests/test_layers.py checks every import)",
            13,
            color=MUTED,
            anchor="start",
        )
    )
    y = top + 58
    band_h, band_gap = 66.0, 8.0
    left, right = 64.0, WIDTH - 24.0
    for (name, rule, modules), fill in zip(LAYERS, LAYER_COLORS, strict=True):
        out.append(rect(left, y, right - left, band_h, fill, "#cbd5e1", r=6))
        out.append(text(left + 14, y + 21, name, 14, "bold", anchor="start"))
        if rule:
            out.append(text(left + 130, y + 21, rule, 12, color=MUTED, anchor="start"))
        # module chips on the band's second row, sized by their text
        cx = left + 14
        widths = [_chip_width(m) for m in modules]
        spacing = 10.0
        avail = right - 14 - cx
        scale = min(1.0, (avail - spacing * (len(modules) - 1)) / sum(widths))
        for m, mw in zip(modules, widths, strict=True):
            mw *= scale
            out.append(rect(cx, y + 32, mw, 24, "#ffffff", "#94a3b8", r=5))
            out.append(_chip_text(cx + mw / 2, y + 48.5, m))
            cx += mw + spacing
        y += band_h + band_gap
    bottom = y - band_gap
    out.append(arrow(36, top + 64, 36, bottom - 4))
    out.append(
        text(
            28,
            (top + 58 + bottom) / 2,
            "imports point down",
            12,
            color=MUTED,
            transform=f"rotate(-90 28 {(top + 58 + bottom) / 2:.1f})",
        )
    )
    return out, bottom + 16


def render() -> str:
    body, y = request_panel(8)
    more, y = layers_panel(y + 14)
    body += more
    height = int(y)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        'role="img" aria-label="specprefill-sdk architecture: Prompt, Scorer, Selector, CompressedPrompt, Backend; '
        'and the layers from entry points down to the floor">\n'
        "<title>specprefill-sdk: one request and the layers</title>\n"
        '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{MUTED}"/></marker></defs>\n'
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>\n'
    )
    return head + "\n".join(body) + "\n</svg>\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(), encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
