#!/usr/bin/python3
"""A user's own data in, the trained model out, read by Python's torch.

Writes two data sets as numpy.save does (a 3-class classification of
Fashion-MNIST's pixels as flat features, and a regression of an image's
brightness from half of its pixels, float64 features and float32 targets),
trains each with `geotrain local` over two regions with output.path set, and
checks what a user would do next:
  - torch.load(model.pt) gives every parameter by name;
  - torch.jit.load(model.torchscript.pt) runs, and its state dict is model.pt's;
  - Python's accuracy (classification) or mean squared error (regression) of
    the exported model on the test split equals what geotrain reported in its
    summary and in model.json: LibTorch and Python compute the same model;
  - output.everyCheckpoint exports along the way, and the final export
    replaces those;
  - resnet18's batch-norm statistics end the same in both regions, and
    Python's accuracy of its export is geotrain's;
  - a bad file stops the job with a message that names it.

Usage: export_python_test.py GEOTRAIN_BINARY
Exit 77 (skipped) without Debian's python3-torch and python3-numpy, or
without dataset-fashion-mnist.
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"skipped: {e} (apt-get install python3-torch python3-numpy)")
    sys.exit(77)

FASHION = "/usr/share/datasets/fashion-mnist"
if not os.path.isdir(FASHION):
    print("skipped: dataset-fashion-mnist is not installed")
    sys.exit(77)

GEOTRAIN = sys.argv[1]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../support"))
from checks import check, failures, finish  # noqa: E402,F401
import checks  # noqa: E402

checks.verbose = True  # the passes are this test's evidence


def read_idx(name, offset):
    with gzip.open(os.path.join(FASHION, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


x_train = read_idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784)
x_test = read_idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)
y_train = read_idx("train-labels-idx1-ubyte.gz", 8)
y_test = read_idx("t10k-labels-idx1-ubyte.gz", 8)


def run(data, out, model_dir, *extra):
    cmd = [GEOTRAIN, "local", "--regions", "london,tokyo", "--steps", "300",
           "--eval-interval", "100", "--set", "dataset.name=npy",
           "--set", f"dataset.path={data}", "--set", f"output.path={model_dir}",
           "--out", out, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


with tempfile.TemporaryDirectory(prefix="geo-export-py-") as tmp:
    # ---- Classification: 3 classes (tops, shoes, the rest), flat features.
    data = os.path.join(tmp, "classes")
    os.makedirs(data)
    group = np.array([0, 0, 0, 0, 0, 1, 0, 1, 2, 1])
    np.save(f"{data}/train_x.npy", ((x_train / 255.0 - 0.286) / 0.353).astype("<f4"))
    np.save(f"{data}/train_y.npy", group[y_train].astype("<i8"))
    np.save(f"{data}/test_x.npy", ((x_test / 255.0 - 0.286) / 0.353).astype("<f4"))
    np.save(f"{data}/test_y.npy", group[y_test].astype("<i8"))
    model_dir = os.path.join(tmp, "model-classes")
    r = run(data, os.path.join(tmp, "run-classes"), model_dir)
    check(r.returncode == 0, f"classification job exits 0 (got {r.returncode}: {r.stderr[-500:]})")
    if r.returncode == 0:
        summary = json.load(open(os.path.join(tmp, "run-classes", "summary.json")))
        meta = json.load(open(os.path.join(model_dir, "model.json")))
        check(meta["outputs"] == 3 and meta["inputShape"] == [784],
              f"model.json: 3 outputs of [784] inputs ({meta['outputs']}, {meta['inputShape']})")
        state = torch.load(os.path.join(model_dir, "model.pt"))
        check(sorted(state) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"],
              f"torch.load gives the state dict by name ({sorted(state)})")
        module = torch.jit.load(os.path.join(model_dir, "model.torchscript.pt"))
        same = all(torch.equal(module.state_dict()[k], v) for k, v in state.items())
        check(same, "the TorchScript module's state dict is model.pt's")
        with torch.no_grad():
            logits = module(torch.from_numpy(np.load(f"{data}/test_x.npy")))
        accuracy = float((logits.argmax(1).numpy() == np.load(f"{data}/test_y.npy")).mean())
        check(abs(accuracy - summary["testAccuracy"]) < 1e-9 and
              abs(accuracy - meta["testAccuracy"]) < 1e-9,
              f"Python's accuracy {accuracy:.4f} is geotrain's {summary['testAccuracy']:.4f}")
        check(accuracy > 0.9, f"the 3-class model learned ({accuracy:.4f} > 0.9)")

    # ---- Regression: mean brightness from the left half, float64 features.
    data = os.path.join(tmp, "regression")
    os.makedirs(data)
    half = lambda x: ((x[:, :392] / 255.0 - 0.286) / 0.353).astype("<f8")
    np.save(f"{data}/train_x.npy", half(x_train[:20000]))
    np.save(f"{data}/train_y.npy", (x_train[:20000].mean(1) / 255.0).astype("<f4"))
    np.save(f"{data}/test_x.npy", half(x_test[:2000]))
    np.save(f"{data}/test_y.npy", (x_test[:2000].mean(1) / 255.0).astype("<f4"))
    model_dir = os.path.join(tmp, "model-regression")
    r = run(data, os.path.join(tmp, "run-regression"), model_dir,
            "--set", "training.loss=mse", "--set", "training.lr=0.01",
            "--set", "checkpoint.interval=100", "--set", "output.everyCheckpoint=true")
    check(r.returncode == 0, f"regression job exits 0 (got {r.returncode}: {r.stderr[-500:]})")
    if r.returncode == 0:
        summary = json.load(open(os.path.join(tmp, "run-regression", "summary.json")))
        log = open(os.path.join(tmp, "run-regression", "logs", "worker-0.log")).read()
        check("the model at step 100 is in" in log and "the model at step 200 is in" in log,
              "output.everyCheckpoint exports at steps 100 and 200")
        meta = json.load(open(os.path.join(model_dir, "model.json")))
        check(meta["final"] is True and meta["step"] == 300 and meta["task"] == "regression",
              f"the final export replaced them (final {meta['final']}, step {meta['step']})")
        module = torch.jit.load(os.path.join(model_dir, "model.torchscript.pt"))
        x = torch.from_numpy(np.load(f"{data}/test_x.npy").astype("<f4"))
        y = torch.from_numpy(np.load(f"{data}/test_y.npy")).reshape(-1, 1)
        with torch.no_grad():
            mse = float(torch.nn.functional.mse_loss(module(x), y))
        check(summary["testAccuracy"] is None, "a regression job reports no accuracy")
        check(abs(mse - summary["testLoss"]) <= 1e-5 * summary["testLoss"],
              f"Python's mse {mse:.6g} is geotrain's {summary['testLoss']:.6g}")
        variance = float(y.var())
        check(mse < 0.2 * variance, f"the regression learned (mse {mse:.3g} < 0.2 × {variance:.3g})")

    # ---- Batch norm: resnet18 on 3x32x32 images. Its running statistics are
    # buffers, not parameters: the final average carries them too, so both
    # regions end with -- and export -- the same whole model.
    images = os.path.join(tmp, "images")
    os.makedirs(images)
    rng = np.random.default_rng(0)
    means = rng.standard_normal((10, 3, 1, 1)).astype("<f4")
    for split, n in (("train", 256), ("test", 128)):
        y = rng.integers(0, 10, n)
        np.save(f"{images}/{split}_x.npy",
                (means[y] + rng.standard_normal((n, 3, 32, 32))).astype("<f4"))
        np.save(f"{images}/{split}_y.npy", y.astype("<i8"))
    model_dir = os.path.join(tmp, "model-resnet")
    r = subprocess.run(
        [GEOTRAIN, "local", "--regions", "london,tokyo", "--model", "resnet18", "--steps", "20",
         "--batch-size", "16", "--eval-interval", "0", "--set", "dataset.name=npy",
         "--set", f"dataset.path={images}", "--set", f"output.path={model_dir}",
         "--out", os.path.join(tmp, "run-resnet")], capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"resnet18 job exits 0 (got {r.returncode}: {r.stderr[-500:]})")
    if r.returncode == 0:
        summary = json.load(open(os.path.join(tmp, "run-resnet", "summary.json")))
        accuracies = {name: reg["testAccuracy"] for name, reg in summary["regions"].items()}
        check(summary["modelsAgree"] is True and len(set(accuracies.values())) == 1,
              f"both regions end with the same model, statistics included ({accuracies})")
        module = torch.jit.load(os.path.join(model_dir, "model.torchscript.pt"))
        module.eval()
        with torch.no_grad():
            logits = module(torch.from_numpy(np.load(f"{images}/test_x.npy")))
        accuracy = float((logits.argmax(1).numpy() == np.load(f"{images}/test_y.npy")).mean())
        check(abs(accuracy - summary["testAccuracy"]) < 1e-6,  # the summary has 6 digits
              f"Python's accuracy of the exported resnet18 {accuracy:.4f} is geotrain's "
              f"{summary['testAccuracy']:.4f}")

    # ---- A bad file stops the job, named.
    np.save(f"{data}/test_y.npy", np.zeros(1999, "<f4"))
    r = run(data, os.path.join(tmp, "run-bad"), os.path.join(tmp, "model-bad"),
            "--set", "training.loss=mse")
    output = r.stdout + r.stderr
    check(r.returncode == 1 and "test_y.npy" in output and "expected [2000]" in output,
          f"a short test_y.npy is refused, named (exit {r.returncode})")
    check(not os.path.exists(os.path.join(tmp, "model-bad")), "and no model is written")

finish()
