"""The report of benchmarks/seed_claims/: the claims table (what the seeds say, what was measured here),
REPORT.md with its detail tables, and the figures.
"""

from pathlib import Path

import torch


LABELS = {"tinytx": "TinyTx", "lstm": "LSTM"}



def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lines(x, series: dict, xlabel: str, ylabel: str, title: str, path: Path, logx=False, hline=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in series.items():
        ax.plot(x, values, "o-", label=label)
    if hline is not None:
        ax.axhline(hline[0], color="k", linestyle=":", label=hline[1])
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_lookup_curves(d: dict, path: Path) -> None:
    """Accuracy against distance: one colour per model, lookup solid, copy dashed, chance dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = [row["distance"] for row in d["rows"]]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, colour in (("tinytx", "tab:blue"), ("lstm", "tab:orange")):
        for kind, style in (("lookup", "o-"), ("copy", "s--")):
            ax.plot(distances, [row[f"{name}_{kind}"] for row in d["rows"]], style, color=colour,
                    label=f"{LABELS[name]} {kind}")
    ax.axhline(d["chance"], color="k", linestyle=":", label=f"chance (1 of {d['task']['num_pairs']} values)")
    ax.set_xscale("log")
    ax.minorticks_off()  # the log axis's own minor labels would overprint the distances
    ax.set_xticks(distances, labels=[str(x) for x in distances])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tokens between the key (or list) and the question (or repeat)")
    ax.set_ylabel("answers right")
    ax.set_title(f"Lookups by distance: same parameters, same budget ({d['budget']} each)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def render_lookup_map(weights: torch.Tensor, labels: torch.Tensor, distance: int, title: str):
    """One head's attention at the questions of one lookup probe: a row per question (the key asked), a column
    per earlier position, a ring on the value that follows the matching key `distance` tokens back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    answers = torch.nonzero(labels != -100).flatten()  # position of each value asked for
    questions = answers - 1
    rows = weights[questions, : int(questions.max()) + 1]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.35 * len(questions)))
    image = ax.imshow(
        rows.numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
    )
    targets = questions - distance + 1  # the value right after the key
    ax.scatter(
        targets.numpy(), range(len(questions)), s=90, facecolors="none", edgecolors="red", label="its value"
    )
    ax.set_yticks(range(len(questions)), labels=[f"question at {q}" for q in questions.tolist()], fontsize=8)
    ax.set_xlabel("position looked at (the key-value pairs open the sequence)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="attention weight")
    fig.tight_layout()
    return fig


def cores_gain(single: dict, name: str) -> float:
    """What all cores add to one model's tokens/s at the longest length (one sequence per step)."""
    longest = [row for row in single["rows"] if row["length"] == single["rows"][-1]["length"]]
    return longest[-1][f"{name}_tokens_per_s"] / longest[0][f"{name}_tokens_per_s"]


def cores_spoiled(single: dict) -> bool:
    """Threads that wait on partners preempted by other processes make both models slower on more cores: then
    the core count says nothing about the models, and the report says so instead of naming a cross-over."""
    return single["cores"] > 1 and cores_gain(single, "tinytx") < 1 and cores_gain(single, "lstm") < 1


def spread(figure: dict) -> str:
    """A figure over seeds: the mean and, when the seeds differ, their range."""
    if figure["min"] == figure["max"]:
        return f"{figure['mean']:.2f}"
    return f"{figure['mean']:.2f} (range {figure['min']:.2f}-{figure['max']:.2f})"


def seeds_said(coref: dict) -> str:
    seeds = [row["seed"] for row in coref["rows"]]
    if seeds == [None]:
        return "the given model"
    steps = sorted({row["steps"] for row in coref["rows"]})
    plural = "s" if len(seeds) > 1 else ""
    return f"seed{plural} {', '.join(map(str, seeds))}, {'/'.join(map(str, steps))} steps each"


def first_seed(coref: dict) -> str:
    return f"seed {coref['rows'][0]['seed']}'s " if len(coref["rows"]) > 1 else ""


def coref_section(coref: dict) -> list[str]:
    """Claim 4 per seed: the accuracies, and for the heads at "it" and at the final "The" their weight on the
    referent against the other noun, on seen and unseen nouns."""

    def head(row, query):
        h = row["heads"][query]
        return [f"{h['layer']}.{h['head']}", f"{h['referent_weight']:.2f} vs {h['other_weight']:.2f}",
                f"{h['unseen_referent_weight']:.2f} vs {h['unseen_other_weight']:.2f}"]

    rows = [[row["seed"] if row["seed"] is not None else "given", row.get("steps", "-"),
             round(row["seconds"]) if "seconds" in row else "-", row["coref"], row["coref_new_nouns"],
             *head(row, "last"), *head(row, "it")] for row in coref["rows"]]
    header = ["seed", "steps", "seconds", "held-out sentences", "unseen nouns", "head at \"The\"",
              "referent vs other", "(unseen nouns)", "head at \"it\"", "referent vs other", "(unseen nouns)"]
    return [
        '## 4. Resolving "it", seed by seed',
        f"Accuracy over {coref['probes_per_kind']} fresh sentences each (chance 0.50): with the training "
        "frames' nouns, and with nouns no training document contains. The heads are the ones the head "
        "search ranks first on the seen sentences; their weight on each noun is averaged over the "
        "sentences.",
        markdown_table(header, rows),
        'At the token "it" a causal model has not yet read the adjective that decides the referent, so the '
        'resolution is read where the noun must be predicted (the final "The"). The maps are the first '
        "seed's heads on the example sentence.",
        "![coref head](coref_head_last.png) ![it head](coref_head_it.png)",
    ]


def claims_table(r: dict) -> list[tuple[str, str, str]]:
    """(claim, what the seeds say, what was measured here) for each claim."""
    q, s, d, c, p, h = (r[k] for k in ("quadratic", "sequential", "lookup", "coref", "positions", "heads"))
    first, last, single = s["rows"][0], s["rows"][-1], s["single_sequence"]
    it, resolved = c["rows"][0]["heads"]["it"], c["rows"][0]["heads"]["last"]
    by_role = {row["role"]: row for row in h["rows"]}
    prev, bos = by_role["previous_token"], by_role["first_token"]
    lookup_head = next(row for row in r["lookup_head"]["rows"] if row["role"] == "induction")
    on_value = r["lookup_head"]["weight_on_value_at_questions"]
    t, lstm = d["training"]["tinytx"], d["training"]["lstm"]

    def curve(name, kind):
        return " / ".join(f"{row[f'{name}_{kind}']:.2f}" for row in d["rows"])

    def speeds(threads):
        rows = [row for row in single["rows"] if row["threads"] == threads]
        return ", ".join(
            f"{row['length']}: {row['tinytx_tokens_per_s']:,.0f} vs {row['lstm_tokens_per_s']:,.0f}"
            for row in (rows[0], rows[-1])
        )

    def crossing(threads):
        length = single["crossover"][threads]
        return f"from length {length}" if length else f"at no length up to {single['rows'][-1]['length']}"

    def gain(name):
        return cores_gain(single, name)

    cores = single["cores"]
    scaling = (
        f"The {cores}-core measurement was spoiled by other processes (both models slower on {cores} cores "
        f"than on 1; load average {single['load_average'][0]:.1f} to {single['load_average'][1]:.1f})"
        if cores_spoiled(single)
        else f"TinyTx reads more tokens/s {crossing(1)} on 1 core, {crossing(cores)} on {cores} cores; at "
        f"the longest, {cores} cores speed TinyTx up ×{gain('tinytx'):.2f}, the LSTM ×{gain('lstm'):.2f}"
    )
    return [
        (
            "1. Twice the window, about four times the looking work",
            "pairing every token with every token grows with n²",
            f"n → 2n: attention FLOPs ×{q['flop_growth_when_n_doubles']:.1f}, time "
            f"×{q['time_growth_when_n_doubles']['eager']:.2f} (eager), "
            f"×{q['time_growth_when_n_doubles']['sdpa']:.2f} (sdpa), n = "
            f"{q['rows'][0]['n']}…{q['rows'][-1]['n']}",
        ),
        (
            "2. You cannot compute token 50's summary until token 49 is done",
            "a recurrent model's steps wait on each other; attention is a few big matrix products",
            f"one sequence per step, training tokens/s TinyTx vs LSTM by length, on 1 core: {speeds(1)}; on "
            f"{cores} cores: {speeds(cores)}. {scaling}. Batch {s['batch_size']}, {s['threads']} thread(s): "
            f"at length {first['length']} TinyTx {first['tinytx_tokens_per_s']:,.0f} vs LSTM "
            f"{first['lstm_tokens_per_s']:,.0f} tokens/s, at {last['length']} "
            f"{last['tinytx_tokens_per_s']:,.0f} vs {last['lstm_tokens_per_s']:,.0f} "
            f"({s['parameters']['tinytx']:,} vs {s['parameters']['lstm']:,} parameters)",
        ),
        (
            "3. A fact from word 1 had a hard time still being alive at word 200",
            "a running summary forgets with distance; attention's path is one step at any distance",
            f"{d['task']['num_pairs']} key-value pairs, each key asked later (MQAR), after {d['budget']} of "
            "training each; value right with the key "
            f"{' / '.join(str(row['distance']) for row in d['rows'])} tokens back: TinyTx "
            f"({t['parameters']:,} parameters, {t['steps']} steps) {curve('tinytx', 'lookup')}; LSTM "
            f"({lstm['parameters']:,}, {lstm['steps']} steps) {curve('lstm', 'lookup')} (chance "
            f"{d['chance']:.2f}). A list of 8 copied that far back: TinyTx {curve('tinytx', 'copy')}; LSTM "
            f"{curve('lstm', 'copy')}",
        ),
        (
            "4. The animal didn't cross the street because it was too tired",
            'attention lets "it" pull information from the animal rather than the street',
            f"resolving \"it\" ({seeds_said(c)}): {spread(c['coref'])} on held-out sentences, "
            f"{spread(c['coref_new_nouns'])} with nouns no training document holds (chance 0.50, "
            f"{c['probes_per_kind']} probes each); {first_seed(c)}best head at the final \"The\" "
            f"({resolved['layer']}.{resolved['head']}) puts {resolved['referent_weight']:.2f} on the "
            f"referent vs {resolved['other_weight']:.2f} on the other noun "
            f"({resolved['unseen_referent_weight']:.2f} vs {resolved['unseen_other_weight']:.2f} with "
            f"unseen nouns); at \"it\" itself ({it['layer']}.{it['head']}) {it['referent_weight']:.2f} vs "
            f"{it['other_weight']:.2f}",
        ),
        (
            "5. Attention is permutation-invariant; rotary scores depend on separation",
            "shuffle the input and the output shuffles identically; rotated q·k depends on m − n",
            f"shuffle error without positions {p['permutation_max_error_without_rope']:.1e} (with RoPE "
            f"{p['permutation_max_error_with_rope']:.2f}); |q_m·k_n − q_(m+s)·k_(n+s)| ≤ "
            f"{p['separation_max_error']:.1e} (moving one token changes it by "
            f"{p['score_change_when_one_token_moves']:.2f})",
        ),
        (
            "6. Different heads specialise",
            "one head may attend consistently to the previous token",
            f"lookup model: the search ranks head {lookup_head['layer']}.{lookup_head['head']} first as "
            f"induction head ({lookup_head['score']:.2f}; untrained best "
            f"{lookup_head['untrained_best']:.2f}, even spread {lookup_head['even_spread']:.3f}); at each "
            f"question it puts {on_value:.2f} of its weight on the value after the key asked, "
            f"{r['lookup_head']['distance']} tokens back; corpus model: previous-token head "
            f"{prev['layer']}.{prev['head']}: {prev['score']:.2f} (untrained best "
            f"{prev['untrained_best']:.2f}, even spread {prev['even_spread']:.2f}); first-token head "
            f"{bos['layer']}.{bos['head']}: {bos['score']:.2f} (untrained {bos['untrained_best']:.2f})",
        ),
    ]


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def lookup_sections(d: dict, head: dict) -> list[str]:
    """The report's claim 3 part: training, accuracy by distance, the task, the lookup head."""
    stages = {name: "; ".join(f"{kind} {length} from step {step}" for step, kind, length in t["stages"])
              for name, t in d["training"].items()}
    return [
        "## 3. Lookups by distance (same parameters, same training budget, same curriculum)",
        markdown_table(
            [
                "model", "parameters", "steps", "tokens seen", "train s", "tokens/s", "final loss",
                "curriculum (task, length)",
            ],
            [
                [
                    name, t["parameters"], t["steps"], t["tokens"], t["seconds"], round(t["tokens_per_s"]),
                    t["final_loss"], stages[name],
                ]
                for name, t in d["training"].items()
            ],
        ),
        markdown_table(
            ["distance (tokens)", "TinyTx lookup", "LSTM lookup", "TinyTx copy", "LSTM copy"],
            [
                [r["distance"], r["tinytx_lookup"], r["lstm_lookup"], r["tinytx_copy"], r["lstm_copy"]]
                for r in d["rows"]
            ],
        ),
        "Lookup (MQAR, after \"Zoology\", Arora et al. 2023): a sequence opens with "
        f"{d['task']['num_pairs']} key-value pairs (distinct keys of {d['task']['num_keys']}, values of "
        f"{d['task']['num_values']}), filler ids follow, and keys are asked again, each answered by its "
        "value; the loss and the score count only those values. Probes ask half the pairs that fit, each "
        f"exactly `distance` tokens after its key; chance is {d['chance']:.2f} (one of the sequence's "
        "values at random). Copy: a list of 8 ids, filler, the list again `distance` tokens later; the "
        "score counts the repeat after its first id. Training mixes both tasks (copying alone first, the "
        "easier way into the circuit both need) and lengthens the sequences up to 512 as a model gets 90% "
        f"of its answers right, or anyway between 30% and 70% of its budget. {d['probes_per_distance']} "
        "probe sequences per distance and task, the same for both models.",
        "![lookups by distance](lookup_by_distance.png)",
        "Which head does it: the head search (`hf_tinytx.interpret.find_heads`, all roles) on lookup probes "
        f"{head['distance']} tokens apart, against the same model untrained:",
        markdown_table(
            ["role", "layer.head", "score", "untrained model's best", "even spread"],
            [
                [r["role"], f"{r['layer']}.{r['head']}", r["score"], r["untrained_best"], r["even_spread"]]
                for r in head["rows"]
            ],
        ),
        "![the lookup head](lookup_head.png)",
    ]


def write_report(results: dict, out_dir: Path) -> str:
    table = markdown_table(
        ["Claim", "What the seeds say", "Measured here"], [list(r) for r in claims_table(results)]
    )
    q, s, h = results["quadratic"], results["sequential"], results["heads"]
    single = s["single_sequence"]
    load = results["load"]
    sections = [
        "# The seeds' claims, measured",
        f"{results['mode']} run, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s) "
        f"({single['cores']} cores), {results['seconds']:.0f} s in all; load average (1 min) "
        f"{load['start']:.1f} at the start, {load['end']:.1f} at the end. Model for claims 4 and 6: "
        f"{results['model_source']}.",
        table,
        "## 1. Attention time vs window n (one layer, forward)",
        markdown_table(
            ["n", "eager ms", "sdpa ms", "attention GFLOP"],
            [[r["n"], r["eager_ms"], r["sdpa_ms"], r["attention_gflop"]] for r in q["rows"]],
        ),
        "## 2. Training step vs sequence length (batch %d)" % s["batch_size"],
        markdown_table(
            ["length", "TinyTx ms", "LSTM ms", "TinyTx tokens/s", "LSTM tokens/s"],
            [
                [
                    r["length"], r["tinytx_step_ms"], r["lstm_step_ms"], round(r["tinytx_tokens_per_s"]),
                    round(r["lstm_tokens_per_s"]),
                ]
                for r in s["rows"]
            ],
        ),
        "![step time](step_time.png)",
        "One sequence per step (its positions are the only parallel work), by length and core count:",
        markdown_table(
            ["threads", "length", "TinyTx tokens/s", "LSTM tokens/s", "TinyTx ÷ LSTM"],
            [
                [
                    r["threads"], r["length"], round(r["tinytx_tokens_per_s"]), round(r["lstm_tokens_per_s"]),
                    r["tinytx_tokens_per_s"] / r["lstm_tokens_per_s"],
                ]
                for r in single["rows"]
            ],
        ),
        "Cross-over (TinyTx ahead at this and every longer length measured): "
        + ", ".join(
            f"{threads} thread(s): {length or 'none'}" for threads, length in single["crossover"].items()
        )
        + ". Load average (1 min) %.1f before these rows, %.1f after." % tuple(single["load_average"])
        + (
            " Both models ran slower on more cores than on one: other processes spoiled those rows, and "
            "their cross-over means nothing."
            if cores_spoiled(single)
            else ""
        ),
        *lookup_sections(results["lookup"], results["lookup_head"]),
        *coref_section(results["coref"]),
        "## 6. Head roles of the corpus model (best head per role)",
        markdown_table(
            ["role", "layer.head", "score", "untrained model's best", "even spread"],
            [
                [r["role"], f"{r['layer']}.{r['head']}", r["score"], r["untrained_best"], r["even_spread"]]
                for r in h["rows"]
            ],
        ),
    ]
    text = "\n\n".join(sections) + "\n"
    (out_dir / "REPORT.md").write_text(text)
    return table


def draw_figures(results: dict, out_dir: Path) -> None:
    s, d = results["sequential"], results["lookup"]
    plot_lines(
        [r["length"] for r in s["rows"]],
        {name: [r[f"{name}_step_ms"] for r in s["rows"]] for name in LABELS}, "sequence length",
        "training step (ms, median)", "Step time vs length, same parameters", out_dir / "step_time.png",
        logx=True,
    )
    plot_lookup_curves(d, out_dir / "lookup_by_distance.png")
