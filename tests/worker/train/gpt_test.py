#!/usr/bin/python3
"""The built-in gpt learns English: its validation loss falls.

Prepares 3 MB of the Python documentation's reStructuredText sources (Debian's
python3.11-doc) as byte tokens with scripts/prepare-text.py, trains a small
gpt (2 layers, width 64, context 64) with `geotrain local --model gpt` over
two regions for 400 steps, and checks: the job succeeds with identical
models; rank 0's periodic validation losses fall; the final one is under
3.2 nats a byte (an untrained model's is ln 256 = 5.55; the bytes' own
frequencies in val.bin, a model of no context, give about 3.5); the worker reports it in bits per token;
summary.json has it as testLoss and no accuracy; the exported model
(output.path), loaded by Python's torch, gives the same validation loss on
the same 64 windows of val.bin (skipped without Debian's python3-torch).

Usage: gpt_test.py GEOTRAIN_BINARY
Exit 77 (skipped) without python3.11-doc.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

SOURCE = "/usr/share/doc/python3.11/html/_sources"
if not os.path.isdir(SOURCE):
    print(f"skipped: {SOURCE} is missing (apt-get install python3.11-doc)")
    sys.exit(77)

GEOTRAIN = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../support"))
from checks import check, failures, finish  # noqa: E402,F401
import checks  # noqa: E402

checks.verbose = True  # the passes are this test's evidence


with tempfile.TemporaryDirectory(prefix="geo-gpt-") as tmp:
    corpus = os.path.join(tmp, "text")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare-text.py"), corpus,
                    "--limit", "3000000"], check=True)
    meta = json.load(open(os.path.join(corpus, "meta.json")))
    check(meta["trainTokens"] == 2700000 and meta["valTokens"] == 300000,
          f"prepare-text split 3 MB 90/10 ({meta['trainTokens']}, {meta['valTokens']})")
    out = os.path.join(tmp, "run")
    r = subprocess.run(
        [GEOTRAIN, "local", "--model", "gpt", "--set", f"dataset.path={corpus}",
         "--regions", "london,tokyo", "--steps", "400", "--eval-interval", "100",
         "--set", "model.width=64", "--set", "model.layers=2", "--set", "model.heads=2",
         "--set", "model.context=64", "--batch-size", "16", "--lr", "0.01",
         "--set", "training.optimizer=adam", "--set", f"output.path={tmp}/model",
         "--out", out],
        capture_output=True, text=True, timeout=900)
    check(r.returncode == 0, f"the gpt job exits 0 (got {r.returncode}: {r.stderr[-600:]})")
    if r.returncode == 0:
        summary = json.load(open(os.path.join(out, "summary.json")))
        check(summary["modelsAgree"] is True, "every worker ends with the same model")
        check(summary["testAccuracy"] is None and summary["testLoss"] is not None,
              f"the summary has a validation loss and no accuracy ({summary['testLoss']})")
        with open(os.path.join(out, "progress.csv")) as f:
            evals = [(int(row["eval_step"]), float(row["eval_loss"]))
                     for row in csv.DictReader(f) if row["rank"] == "0" and row["eval_loss"]]
        print("rank 0's validation losses:", evals)
        check(len(evals) >= 3, f"rank 0 evaluated along the way ({len(evals)} evaluations)")
        if len(evals) >= 3:
            check(evals[-1][1] < evals[0][1] - 0.2,
                  f"the validation loss falls ({evals[0][1]:.3f} at step {evals[0][0]} -> "
                  f"{evals[-1][1]:.3f} at step {evals[-1][0]})")
            check(evals[-1][1] < 3.2, f"to under 3.2 nats a byte ({evals[-1][1]:.3f})")
        log = open(os.path.join(out, "logs", "worker-0.log")).read()
        check("bits per token" in log and "gpt 2 layers, width 64, 2 heads, context 64" in log,
              "the worker names the model and reports bits per token")

        try:
            import numpy as np
            import torch
        except ImportError as e:
            print(f"the export's Python check skipped: {e} (apt-get install python3-torch "
                  "python3-numpy)")
        else:
            # What a user does with the result: load it and measure it. The
            # worker's validation windows: 64 of context + 1 tokens, evenly
            # spread over val.bin (worker/train/dataset.cc).
            model = torch.jit.load(os.path.join(tmp, "model", "model.torchscript.pt"))
            state = torch.load(os.path.join(tmp, "model", "model.pt"))
            check(all(torch.equal(state[k], v) for k, v in model.state_dict().items())
                  and len(state) == len(model.state_dict()),
                  "the TorchScript module holds model.pt's tensors")
            val = np.fromfile(os.path.join(corpus, "val.bin"), dtype="<u2").astype(np.int64)
            span = len(val) - 64
            starts = [w * span // 64 for w in range(64)]
            windows = torch.from_numpy(np.stack([val[s:s + 65] for s in starts]))
            model.eval()
            with torch.no_grad():
                logits = model(windows[:, :64])
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)).item()
            check(abs(loss - summary["testLoss"]) < 1e-3,
                  f"Python's validation loss of the exported gpt is geotrain's "
                  f"({loss:.5f} against {summary['testLoss']:.5f})")

finish()
