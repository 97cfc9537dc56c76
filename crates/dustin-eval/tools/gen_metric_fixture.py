"""Writes tests/fixtures/longbench_reference.json: expected values computed by LongBench's own
Python code, for the Rust cross-check test (tests/reference_fixture.rs).

Reference code:
  * THUDM/LongBench `LongBench/metrics.py` (commit 2e00731f8d0bff23dc4325161044d0ed8af94c1e),
    imported as is; `jieba` (needed only by the Chinese metrics) is stubbed;
  * PyPI `rouge==1.0.1`, `fuzzywuzzy==0.18.0`, and `python-Levenshtein==0.27.5` for the second
    fuzz backend; Python 3.11.7.

fuzzywuzzy picks its SequenceMatcher at import time, so the script is run twice, once in an
environment without python-Levenshtein (difflib backend) and once with it; each run adds its
`code_sim_*` section to the same file:

    python -m venv /tmp/nolev && /tmp/nolev/bin/pip install rouge==1.0.1 fuzzywuzzy==0.18.0
    python -m venv /tmp/lev && /tmp/lev/bin/pip install rouge==1.0.1 fuzzywuzzy==0.18.0 \
        python-Levenshtein==0.27.5
    git show 2e00731:LongBench/metrics.py > /tmp/metrics.py   # in a THUDM/LongBench clone
    /tmp/nolev/bin/python tools/gen_metric_fixture.py /tmp/metrics.py ../../../shared/data/longbench
    /tmp/lev/bin/python tools/gen_metric_fixture.py /tmp/metrics.py ../../../shared/data/longbench
"""
import importlib.util
import json
import os
import random
import sys
import types

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "longbench_reference.json")

sys.modules["jieba"] = types.ModuleType("jieba")  # only the Chinese metrics use it
spec = importlib.util.spec_from_file_location("lb_metrics", sys.argv[1])
M = importlib.util.module_from_spec(spec)
spec.loader.exec_module(M)
from fuzzywuzzy import fuzz  # noqa: E402

BACKEND = "levenshtein" if fuzz.SequenceMatcher.__module__.endswith("StringMatcher") else "difflib"

# LongBench eval.py dataset2metric, English tasks.
DATASET2METRIC = {
    "narrativeqa": M.qa_f1_score, "qasper": M.qa_f1_score, "multifieldqa_en": M.qa_f1_score,
    "hotpotqa": M.qa_f1_score, "2wikimqa": M.qa_f1_score, "musique": M.qa_f1_score,
    "gov_report": M.rouge_score, "qmsum": M.rouge_score, "multi_news": M.rouge_score,
    "trec": M.classification_score, "triviaqa": M.qa_f1_score, "samsum": M.rouge_score,
    "passage_retrieval_en": M.retrieval_score, "passage_count": M.count_score,
    "lcc": M.code_sim_score, "repobench-p": M.code_sim_score,
}


def sample_score(dataset, prediction, ground_truths, all_classes):
    """eval.py scorer(), one sample."""
    score = 0.0
    if dataset in ["trec", "triviaqa", "samsum", "lsht"]:
        prediction = prediction.lstrip("\n").split("\n")[0]
    for ground_truth in ground_truths:
        score = max(score, DATASET2METRIC[dataset](prediction, ground_truth, all_classes=all_classes))
    return score


def rouge_recursion_error(pred, gold):
    """True where the rouge package hits Python's recursion limit (LongBench then says 0.0)."""
    from rouge import Rouge
    try:
        Rouge().get_scores([pred], [gold], avg=True)
    except RecursionError:
        return True
    except Exception:
        return False
    return False


rng = random.Random(20240611)
WORDS = ["the", "The", "a", "A", "an", "An", "cat", "Cat", "sat", "on", "mat", "dog", "ran",
         "fast", "5", "05", "12", "3", "Paragraph", "paragraph", "theater", "apple", "pie",
         "x", "é", "naïve", "über", "٣", "thé", "yes", "no", "unanswerable", "_a", "a_"]
SEPS = [" ", " ", " ", "  ", "\t", "\n", ". ", ".", ", ", "!", "-", "'", "\u00a0", "\u2003",
        "\x1c", " . ", "...", "?", "—", "(", ")"]


def rand_text(max_words=12):
    n = rng.randint(0, max_words)
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice(SEPS))
    if rng.random() < 0.3 and parts:
        parts.pop()
    return "".join(parts)


CODE_ATOMS = ["x", "y", " = ", "(", ")", "foo", "bar", "1", "2", "self.", "return ", "  ",
              "# c", "//", "`", "\n", "[i]", "+", "e", "é", "ab", "ba"]


def rand_code(max_atoms=14):
    return "".join(rng.choice(CODE_ATOMS) for _ in range(rng.randint(0, max_atoms)))


data = {}
if os.path.exists(OUT):
    with open(OUT, encoding="utf-8") as f:
        data = json.load(f)

data["source"] = ("Computed by tools/gen_metric_fixture.py with THUDM/LongBench "
                  "LongBench/metrics.py @ 2e00731f8d0bff23dc4325161044d0ed8af94c1e, rouge 1.0.1, "
                  "fuzzywuzzy 0.18.0 (difflib and python-Levenshtein 0.27.5 backends), "
                  "Python " + sys.version.split()[0])

if BACKEND == "difflib":
    # Backend-independent sections are written on the difflib run.
    data["normalize_answer"] = [[t, M.normalize_answer(t)] for t in (rand_text() for _ in range(60))]
    data["qa_f1"] = []
    for _ in range(80):
        p, g = rand_text(), rand_text()
        if rng.random() < 0.3:
            g = p  # identical or near-identical pairs too
            if rng.random() < 0.5:
                g = g + " " + rand_text(3)
        data["qa_f1"].append([p, g, M.qa_f1_score(p, g)])
    data["rouge"] = []
    for _ in range(80):
        p, g = rand_text(25), rand_text(25)
        if rng.random() < 0.3:
            g = p + rand_text(4)
        assert not rouge_recursion_error(p, g)
        data["rouge"].append([p, g, M.rouge_score(p, g)])
    data["retrieval"] = []
    for _ in range(40):
        gold = "Paragraph %d" % rng.choice([1, 3, 13, 30])
        p = " ".join(rng.choice(["Paragraph", "3", "13", "30", "1", "٣", "x", "Paragraph 3", "03", "3x1"])
                     for _ in range(rng.randint(0, 5)))
        data["retrieval"].append([p, gold, M.retrieval_score(p, gold)])
    data["count"] = []
    for _ in range(30):
        gold = rng.choice(["3", "5", "13", "20"])
        p = " ".join(rng.choice(["3", "13", "20", "1", "5", "there are", "05"]) for _ in range(rng.randint(0, 5)))
        data["count"].append([p, gold, M.count_score(p, gold)])
    classes = ["Other", "entity", "Other entity", "Plant", "Plant part", "Date", "Individual", "a"]
    data["classification"] = {"all_classes": classes, "cases": []}
    for _ in range(60):
        gold = rng.choice(classes)
        p = " ".join(rng.choice(classes + ["zz", "Type:"]) for _ in range(rng.randint(0, 4)))
        data["classification"]["cases"].append([p, gold, M.classification_score(p, gold, all_classes=classes)])
    data["round2"] = []
    for _ in range(40):
        x = rng.choice([rng.random() * 100, rng.randint(0, 100000) / 1000, rng.randint(0, 800) / 8])
        data["round2"].append([x, round(x, 2)])
    lits = []
    alphabet = ["a", "'", '"', "\\", "\n", "\t", "\r", "é", "\u2028", "\x00", "\x7f", "😀", " ", "b", "\x1b"]
    for _ in range(40):
        lst = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(0, 4))]
        lits.append([repr(lst), lst])
    data["py_list_literals"] = lits

    # Every shared MiniLongBench sample, scored on its `prediction` field (another system's
    # output) exactly as eval.py would score it.
    shared = []
    lb_dir = sys.argv[2]
    for fn in sorted(os.listdir(lb_dir)):
        if not fn.endswith(".json"):
            continue
        task = fn[:-5]
        with open(os.path.join(lb_dir, fn), encoding="utf-8") as f:
            d = json.load(f)
        for sid, rec in d.items():
            gold = rec["gold"]
            if isinstance(gold, dict):
                answers, all_classes = gold["answers"], gold["all_classes"]
            else:
                answers, all_classes = gold, None
            pred = rec["prediction"]
            entry = {"task": task, "id": sid}
            if DATASET2METRIC[task] is M.rouge_score:
                p = pred.lstrip("\n").split("\n")[0] if task == "samsum" else pred
                if any(rouge_recursion_error(p, g) for g in answers):
                    entry["python_recursion_error"] = True
            entry["score"] = sample_score(task, pred, answers, all_classes)
            shared.append(entry)
    data["shared_samples"] = shared

# Code similarity, for the backend of this environment.
cases = []
for _ in range(80):
    p, g = rand_code(), rand_code(8).replace("\n", "")
    if rng.random() < 0.2:
        g = p.split("\n")[-1]
    cases.append([p, g, M.code_sim_score(p, g)])
# Long gold lines (>= 200 code points) exercise difflib's autojunk "popular" rule.
for _ in range(10):
    g = "".join(rng.choice(["ab", "a", "b", " ", "x", "(", ")"]) for _ in range(rng.randint(200, 260)))
    p = "".join(rng.choice([g[i:i + 7] for i in range(0, len(g), 7)] + ["zz"]) for _ in range(30))
    cases.append([p, g, M.code_sim_score(p, g)])
# Long gold lines over a large alphabet: some characters are "popular" (> 3 occurrences), most
# are not, so difflib's autojunk rule changes the blocks without emptying them.
alphabet = [chr(c) for c in range(33, 127) if chr(c) not in "#/`"] + list("éèàüößçñøåæ")
for _ in range(12):
    g = "".join(rng.choice(alphabet) for _ in range(rng.randint(200, 300)))
    p = "".join(rng.choice([g[i:i + 9] for i in range(0, len(g), 9)] + ["zz", " "]) for _ in range(30))
    cases.append([p, g, M.code_sim_score(p, g)])
data["code_sim_" + BACKEND] = cases

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w", encoding="utf-8") as f:
    json.dump(data, f, ensure_ascii=True, indent=1)
    f.write("\n")
print("wrote", OUT, "backend", BACKEND)
