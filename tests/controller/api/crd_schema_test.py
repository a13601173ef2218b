#!/usr/bin/python3
"""The CRD's OpenAPI schema and the controller's validation agree.

Runs the same TrainingJob samples through
  - the CRD's openAPIV3Schema (manifests/crd/trainingjobs.geotrain.io.yaml),
    evaluated with python3-jsonschema as a draft-04 schema (OpenAPI 3.0's
    dialect: boolean exclusiveMinimum), after filling in the schema's defaults
    the way the API server does; and
  - the controller's parseSpec() (through validate_spec_tool),
and checks:
  1. every sample the schema can judge is accepted or rejected by both;
  2. for accepted samples, the schema's defaults and the controller's are the
     same: the defaulted object and the original parse to the same spec;
  3. the schema and the controller know the same fields (specToJson of the
     defaults against the schema's properties, both ways);
  4. samples that only a CEL rule (x-kubernetes-validations) or a list-map key
     catches -- the schema dialect here cannot run CEL -- are rejected by the
     controller, and the CRD has a rule for each;
  5. the few samples only the controller catches (CONTROLLER_ONLY: a rule
     would cost more than the API server's CEL budget) are accepted by the
     schema and rejected by the controller;
  6. the bounds that are the QSGD kernels' (BOUNDS: sync.bucket, sync.bits)
     are the same in both, and a value past them is refused by both naming
     the field and the range.
The sample TrainingJobs (manifests/samples) are good samples too.
Usage: crd_schema_test.py VALIDATE_SPEC_TOOL CRD.yaml SAMPLES_DIR
"""

import copy
import glob
import json
import os
import subprocess
import sys

import jsonschema
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../support"))
from checks import check, failures, finish  # noqa: E402,F401


def apply_defaults(schema, value):
    """What the API server's defaulting does: fill absent properties that
    have a default, then recurse into objects and array items."""
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k in value:
                if k not in schema.get("properties", {}):
                    apply_defaults(extra, value[k])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def minimal():
    return {"regions": [{"name": "london"}]}


def world():
    return {
        "image": "registry.example/geotrain-worker:0.1", "seed": 7,
        "model": {"builtin": "cnn"},
        "dataset": {"name": "fashion-mnist", "path": "/data/fmnist"},
        "training": {"steps": 5000, "batchSize": 128, "lr": 0.1, "weightDecay": 0.0005},
        "sync": {"algorithm": "dts", "period": 8, "delay": "auto", "codec": "qsgd", "bits": 4,
                 "timeoutSeconds": 2.5},
        "checkpoint": {"dir": "/ckpt", "interval": 250},
        "checkpointVolume": {"size": "50Gi", "storageClassName": "standard",
                             "accessMode": "ReadWriteMany"},
        "regions": [
            {"name": "london", "cluster": "eu", "replicas": 2,
             "resources": {"limits": {"nvidia.com/gpu": 1}}, "nodeSelector": {"gpu": "h100"},
             "tolerations": [{"key": "gpu", "operator": "Exists"}],
             "gateway": {"serviceType": "NodePort", "endpoint": "london.example.org:31000"}},
            {"name": "tokyo", "replicas": 2, "dataPath": "/mnt/tokyo",
             "gateway": {"endpoint": "[2001:db8::1]:7000"},
             "env": [{"name": "HF_HOME", "value": "/tokyo-cache"}],
             "volumes": [{"name": "data", "nfs": {"server": "nfs.tokyo", "path": "/d"}}],
             "volumeMounts": [{"name": "data", "mountPath": "/mnt/tokyo"}],
             "imagePullSecrets": [{"name": "tokyo-regcred"}],
             "serviceAccountName": "tokyo-trainer", "priorityClassName": "spot",
             "affinity": {"podAntiAffinity": {}}, "labels": {"site": "tokyo"},
             "annotations": {"cost-center": "42"}}],
        "runPolicy": {"backoffLimitPerIndex": 2, "backoffLimit": 1,
                      "activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 0},
        "ttlSecondsAfterFinished": 3600,
        "template": {
            "metadata": {"labels": {"team": "ml"}, "annotations": {"owner": "ml@example.org"}},
            "spec": {"env": [{"name": "HF_HOME", "value": "/cache"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                     "imagePullSecrets": [{"name": "regcred"}],
                     "serviceAccountName": "trainer", "priorityClassName": "batch-high",
                     "affinity": {"nodeAffinity": {}},
                     "tolerations": [{"key": "gpu", "operator": "Exists"}],
                     "nodeSelector": {"pool": "gpu"},
                     "resources": {"requests": {"cpu": "2"}}}},
    }


def merged(patch):
    spec = minimal()
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k].update(v)
        else:
            spec[k] = v
    return spec


GOOD = [
    minimal(), world(),
    merged({"model": {"torchscript": "/models/net.pt"}}),
    merged({"model": {"builtin": "", "torchscript": "/models/net.pt"}}),
    merged({"sync": {"delay": "auto"}}), merged({"sync": {"delay": 4}}),
    merged({"sync": {"period": "auto"}}),
    merged({"dataset": {"name": "synthetic", "path": ""}}),
    merged({"sync": {"algorithm": "swarm", "swarmH": 2, "codec": "bf16"}}),
    merged({"training": {"lr": 1e-4, "momentum": 0, "stepGamma": 1}}),
    merged({"runPolicy": {"backoffLimitPerIndex": 0, "backoffLimit": 2**31 - 1}}),
    merged({"regions": [{"name": "a", "replicas": 4096, "gateway": {"port": 65535}}]}),
    merged({"checkpoint": {"dir": "/ckpt"}, "checkpointVolume": {"size": "20Gi"}}),
    merged({"checkpoint": {"dir": "/ckpt"},
            "checkpointVolume": {"size": "1.5T", "storageClassName": "fast-ssd.example.com",
                                 "accessMode": "ReadWriteMany"}}),
    # A job-wide mount whose volume each region brings itself.
    {"template": {"spec": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
     "regions": [{"name": "a", "volumes": [{"name": "data", "emptyDir": {}}]},
                 {"name": "b", "volumes": [{"name": "data", "hostPath": {"path": "/d"}}]}]},
    merged({"template": {"metadata": {"labels": {"app.kubernetes.io/version": "1"}}}}),
    # cuda where every region's pods ask for a GPU (the template's or their own).
    {"training": {"device": "cuda"},
     "template": {"spec": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
     "regions": [{"name": "a"}, {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
]

# Rejected by the schema's types, enums, ranges and patterns.
BAD = [
    merged({"sync": {"bits": 3}}), merged({"sync": {"algorithm": "ring"}}),
    merged({"sync": {"codec": "zstd"}}),
    merged({"sync": {"timeoutSeconds": 0}}), merged({"sync": {"hierarchical": "yes"}}),
    merged({"training": {"lr": 0}}), merged({"training": {"lr": "fast"}}),
    merged({"training": {"momentum": 1.0}}), merged({"training": {"steps": 1.5}}),
    merged({"training": {"steps": 0}}), merged({"training": {"stepGamma": 0}}),
    merged({"training": {"optimizer": "lamb"}}), merged({"training": {"device": "tpu"}}),
    merged({"dataset": {"name": "imagenet"}}), merged({"dataset": {"syntheticSamples": 0}}),
    merged({"checkpoint": {"keep": 0}}), merged({"log": {"level": "loud"}}),
    merged({"log": {"format": "xml"}}),
    merged({"model": {"builtin": "vgg"}}), merged({"seed": -1}),
    {"regions": []}, {"image": "x"}, {"regions": [{"replicas": 2}]},
    {"regions": [{"name": "London"}]}, {"regions": [{"name": "a-"}]},
    {"regions": [{"name": "a", "replicas": 0}]}, {"regions": [{"name": "a", "replicas": 5000}]},
    {"regions": [{"name": "a", "cluster": "EU"}]},
    {"regions": [{"name": "a", "gateway": {"serviceType": "Ingress"}}]},
    {"regions": [{"name": "a", "gateway": {"port": 70000}}]},
    {"regions": [{"name": "a", "gateway": {"endpoint": "host"}}]},
    {"regions": [{"name": "a", "gateway": {"endpoint": "host:070"}}]},
    {"regions": [{"name": "a", "gateway": {"endpoint": "host:65536"}}]},
    {"regions": [{"name": "a", "gateway": {"endpoint": "a host:7000"}}]},
    {"regions": [{"name": "a", "nodeSelector": {"gpu": 1}}]},
    {"regions": [{"name": "a", "tolerations": ["x"]}]},
    {"regions": [{"name": "a", "resources": []}]},
    {"regions": [{"name": f"r{i}"} for i in range(65)]},
    merged({"runPolicy": {"backoffLimit": -1}}),
    merged({"runPolicy": {"backoffLimit": 2**31}}),
    merged({"runPolicy": {"backoffLimitPerIndex": -1}}),
    merged({"runPolicy": {"backoffLimitPerIndex": 2**31}}),
    merged({"runPolicy": {"backoffLimitPerIndex": "6"}}),
    merged({"runPolicy": {"activeDeadlineSeconds": 0}}),
    merged({"runPolicy": {"ttlSecondsAfterFinished": -1}}),
    merged({"ttlSecondsAfterFinished": -1}), merged({"ttlSecondsAfterFinished": "1h"}),
    merged({"runPolicy": {"suspend": "yes"}}),
    merged({"checkpoint": {"dir": "/c"}, "checkpointVolume": {"size": "20GB"}}),
    merged({"checkpoint": {"dir": "/c"}, "checkpointVolume": {"storageClassName": "x"}}),
    merged({"checkpoint": {"dir": "/c"}, "checkpointVolume": {"size": "1Gi", "accessMode": "RWX"}}),
    merged({"template": {"spec": {"env": [{"value": "1"}]}}}),
    merged({"template": {"spec": {"env": [{"name": "A=B"}]}}}),
    merged({"template": {"spec": {"env": {"A": "1"}}}}),
    merged({"template": {"spec": {"volumes": [{"name": "Data"}]}}}),
    merged({"template": {"spec": {"volumeMounts": [{"name": "d", "mountPath": "rel"}]}}}),
    merged({"template": {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                                  "volumeMounts": [{"name": "d", "mountPath": "/" + "a" * 1024}]}}}),
    merged({"template": {"spec": {"volumeMounts": [{"mountPath": "/d"}]}}}),
    merged({"template": {"spec": {"imagePullSecrets": [{"name": "Reg_Cred"}]}}}),
    merged({"template": {"spec": {"serviceAccountName": "Trainer"}}}),
    merged({"template": {"spec": {"priorityClassName": "high priority"}}}),
    merged({"template": {"spec": {"affinity": []}}}),
    merged({"template": {"spec": {"sysctls": [{"name": "net.ipv4..tcp_rmem", "value": "1"}]}}}),
    merged({"template": {"spec": {"sysctls": [{"name": "net.core.somaxconn"}]}}}),
    {"regions": [{"name": "a", "sysctls": [{"name": "Net.Core", "value": "1"}]}]},
    merged({"template": {"metadata": {"labels": {"team": 1}}}}),
    {"regions": [{"name": "a", "env": [{"name": ""}]}]},
    {"regions": [{"name": "a", "annotations": {"x": True}}]},
]

# Caught only by CEL rules or list-map keys, which this schema dialect cannot
# evaluate: (sample, a phrase of the CRD rule's message or the list-map key).
CEL_ONLY = [
    (merged({"sync": {"delay": -1}}), "an integer >= 0, or auto"),
    (merged({"sync": {"delay": "soon"}}), "an integer >= 0, or auto"),
    (merged({"sync": {"period": 0}}), "an integer >= 1, or auto"),
    (merged({"sync": {"period": "often"}}), "an integer >= 1, or auto"),
    (merged({"model": {"builtin": "mlp", "torchscript": "/m.pt"}}),
     "set exactly one of builtin and torchscript"),
    (merged({"model": {"builtin": ""}}), "builtin is empty and no torchscript is set"),
    (merged({"dataset": {"name": "npy", "path": ""}}), "needs a path"),
    ({"regions": [{"name": "a"}, {"name": "a"}]}, "x-kubernetes-list-map-keys"),
    ({"regions": [{"name": "a", "gateway": {"serviceType": "NodePort"}}]},
     "a NodePort gateway needs an endpoint"),
    ({"regions": [{"name": "a", "gateway": {"serviceType": "NodePort",
                                           "endpoint": "n1.example:7000"}}]},
     "a NodePort gateway needs an endpoint"),
    (merged({"sync": {"hierarchical": False},
             "regions": [{"name": "a", "replicas": 2}, {"name": "b"}]}),
     "sync.hierarchical must be true"),
    (merged({"checkpointVolume": {"size": "20Gi"}}), "checkpointVolume is mounted at checkpoint.dir"),
    (merged({"template": {"spec": {"env": [{"name": "JOB_COMPLETION_INDEX", "value": "0"}]}}}),
     "JOB_COMPLETION_INDEX is the worker's own variable"),
    ({"regions": [{"name": "a", "env": [{"name": "A"}, {"name": "A"}]}]},
     "x-kubernetes-list-map-keys"),
    ({"regions": [{"name": "a", "volumes": [{"name": "keys", "emptyDir": {}}]}]},
     "config, keys, tmp and checkpoints are the worker's own volumes"),
    (merged({"template": {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                                   "volumeMounts": [{"name": "d", "mountPath": "/tmp"}]}}}),
     "are the worker's own mounts"),
    (merged({"checkpoint": {"dir": "/ckpt"},
             "template": {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                                   "volumeMounts": [{"name": "d", "mountPath": "/ckpt"}]}}}),
     "checkpoint.dir is the worker's own mount"),
    (merged({"template": {"metadata": {"labels": {"geotrain.io/job": "x"}}}}),
     "a label key of the controller is not allowed"),
    (merged({"template": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}}),
     "a label key of the controller is not allowed"),
    ({"regions": [{"name": "a", "annotations": {"prometheus.io/port": "1"}}]},
     "an annotation key of the controller is not allowed"),
]


# Caught by the controller alone (InvalidSpec): a CEL rule for the volumes
# would compare every mount with every volume of every region, beyond what the
# API server's CEL cost budget allows for lists this long; the GPU rules read
# resources, which the schema keeps as core/v1 has it (any fields, quantities
# as integers or strings).
CONTROLLER_ONLY = [
    (merged({"training": {"device": "cuda"}}),
     "spec.training.device: cuda is not allowed: the pods of london (spec.regions[0]) ask for "
     "no GPU (allowed: auto"),
    ({"template": {"spec": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
      "training": {"device": "cuda"},
      "regions": [{"name": "a"}, {"name": "b", "resources": {"limits": {"cpu": "1"}}}]},
     "the pods of b (spec.regions[1]) ask for no GPU"),
    ({"regions": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "one"}}}]},
     "spec.regions[0].resources.limits.nvidia.com/gpu: \"one\" is not allowed (allowed: a whole "
     "number of GPUs, e.g. 1)"),
    (merged({"template": {"spec": {"volumeMounts": [{"name": "d", "mountPath": "/d"}]}}}),
     "has no such volume"),
    ({"template": {"spec": {"volumeMounts": [{"name": "d", "mountPath": "/d"}]}},
      "regions": [{"name": "a", "volumes": [{"name": "d", "emptyDir": {}}]}, {"name": "b"}]},
     "region b has no such volume"),
    ({"regions": [{"name": "a", "volumeMounts": [{"name": "d", "mountPath": "/d"}]}]},
     "region a has no such volume"),
]


# The QSGD kernels' limits: (field, accepted values, refused values, the
# schema's message for a refused value, the controller's range).
QSGD_MAX_BUCKET = 2**30
BOUNDS = [
    ("bucket", [1, QSGD_MAX_BUCKET], [0, QSGD_MAX_BUCKET + 1, 2**31],
     lambda v: (f"{v} is less than the minimum of 1" if v < 1 else
                f"{v} is greater than the maximum of {QSGD_MAX_BUCKET}"),
     f"(allowed: an integer 1..{QSGD_MAX_BUCKET})"),
    ("bits", [2, 4, 8], [1, 3, 16], lambda v: f"{v} is not one of [2, 4, 8]",
     "(allowed: 2, 4, 8)"),
]


def tool_results(tool, specs):
    objects = [json.dumps({"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "t", "namespace": "default"}, "spec": s})
               for s in specs]
    out = subprocess.run([tool], input="\n".join(objects) + "\n", capture_output=True,
                         text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def flatten(value, prefix=""):
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): value}


def schema_keys(schema, prefix=""):
    keys = set()
    for name, sub in schema.get("properties", {}).items():
        path = prefix + name
        if sub.get("type") == "object" and "properties" in sub:
            keys |= schema_keys(sub, path + ".")
        else:
            keys.add(path)
    return keys


def json_keys(value, prefix=""):
    keys = set()
    for name, sub in value.items():
        path = prefix + name
        if isinstance(sub, dict) and name not in ("resources", "nodeSelector", "labels",
                                                  "annotations", "affinity"):
            keys |= json_keys(sub, path + ".")
        else:
            keys.add(path)
    return keys


def main():
    tool, crd_path, samples_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    samples = sorted(glob.glob(os.path.join(samples_dir, "*.yaml")))
    check(len(samples) >= 4, f"only {len(samples)} samples in {samples_dir}")
    for path in samples:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            check(d.get("kind") == "TrainingJob" and
                  d.get("apiVersion") == "geotrain.io/v1alpha1", f"{path}: not a TrainingJob")
            GOOD.append(d["spec"])
    with open(crd_path) as f:
        crd = next(d for d in yaml.safe_load_all(f) if d)
    version = crd["spec"]["versions"][0]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    validator = jsonschema.Draft4Validator(spec_schema)

    def schema_errors(spec):
        return [f"{'.'.join(map(str, e.absolute_path)) or 'spec'}: {e.message}"
                for e in validator.iter_errors(apply_defaults(spec_schema, copy.deepcopy(spec)))]

    # 1 and 2.
    results = tool_results(tool, GOOD + BAD)
    defaulted = tool_results(tool, [apply_defaults(spec_schema, copy.deepcopy(s)) for s in GOOD])
    for i, spec in enumerate(GOOD):
        errs = schema_errors(spec)
        check(not errs, f"schema rejects good sample {json.dumps(spec)}: {errs}")
        check(not results[i]["errors"],
              f"controller rejects good sample {json.dumps(spec)}: {results[i]['errors']}")
        a, b = flatten(results[i]["spec"] or {}), flatten(defaulted[i]["spec"] or {})
        diff = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        check(not diff, f"defaults differ for {json.dumps(spec)[:120]}: "
                        f"{{field: (controller, CRD)}} = {diff}")
    for j, spec in enumerate(BAD):
        errs = schema_errors(spec)
        got = results[len(GOOD) + j]["errors"]
        check(errs, f"schema accepts bad sample {json.dumps(spec)[:200]}")
        check(got, f"controller accepts bad sample {json.dumps(spec)[:200]} "
                   f"(schema: {errs[:1]})")
    print(f"{len(GOOD)} good ({len(samples)} from {samples_dir}) and {len(BAD)} bad samples: "
          f"schema and controller agree")

    # 3. The same fields.
    controller_keys = json_keys(results[1]["spec"]) | json_keys(results[0]["spec"])
    schema_fields = schema_keys(spec_schema)
    region_fields = {"regions." + k for k in
                     schema_keys(spec_schema["properties"]["regions"]["items"])}
    controller_flat = {k for k in controller_keys if not k.startswith("regions")}
    missing = controller_flat - schema_fields
    check(not missing, f"fields the controller writes but the CRD lacks: {sorted(missing)}")
    extra = {k for k in schema_fields - controller_flat if k not in ("image", "regions")}
    extra -= {"runPolicy.activeDeadlineSeconds", "runPolicy.ttlSecondsAfterFinished"}
    check(not extra, f"CRD fields the controller does not read back: {sorted(extra)}")
    region_keys = {"regions." + k for r in results[1]["spec"]["regions"] for k in json_keys(r)}
    check(region_keys <= region_fields,
          f"region fields missing in the CRD: {sorted(region_keys - region_fields)}")
    print(f"fields: {len(schema_fields)} spec and {len(region_fields)} region fields match")

    # 4. CEL-only samples.
    text = open(crd_path).read()
    cel = tool_results(tool, [s for s, _ in CEL_ONLY])
    for (spec, phrase), r in zip(CEL_ONLY, cel):
        check(r["errors"], f"controller accepts {json.dumps(spec)} (CRD: {phrase})")
        check(phrase in text, f"the CRD has no rule saying '{phrase}'")
    print(f"{len(CEL_ONLY)} CEL / list-map samples: rejected by the controller, rules present")

    # 5. Controller-only samples: accepted by the schema, refused by the
    # controller with the message given.
    only = tool_results(tool, [s for s, _ in CONTROLLER_ONLY])
    for (spec, phrase), r in zip(CONTROLLER_ONLY, only):
        check(not schema_errors(spec), f"schema rejects {json.dumps(spec)}")
        check(any(phrase in e for e in r["errors"]),
              f"controller: {r['errors']} for {json.dumps(spec)} (expected '{phrase}')")
    print(f"{len(CONTROLLER_ONLY)} controller-only samples: rejected by the controller")

    # 6. Limits that are the QSGD kernels' (kernels/qsgd_limits.h, which the
    # controller's validation states through the worker.yaml schema): the
    # CRD's bounds are exactly theirs, and both refuse a value past them
    # naming the field and the range.
    for field, good, bad, schema_says, controller_says in BOUNDS:
        r = tool_results(tool, [merged({"sync": {field: v}}) for v in good + bad])
        for v, res in zip(good, r):
            check(not schema_errors(merged({"sync": {field: v}})), f"schema rejects {field} {v}")
            check(not res["errors"], f"controller rejects {field} {v}: {res['errors']}")
        for v, res in zip(bad, r[len(good):]):
            errs = schema_errors(merged({"sync": {field: v}}))
            check(any(e.startswith(f"sync.{field}:") and schema_says(v) in e for e in errs),
                  f"schema: {errs} for {field} {v} (expected '{schema_says(v)}')")
            check(any(e.startswith(f"spec.sync.{field}: {v} is not allowed") and
                      controller_says in e for e in res["errors"]),
                  f"controller: {res['errors']} for {field} {v} (expected '{controller_says}')")
    print(f"{len(BOUNDS)} kernel limits: the CRD's bounds are the controller's")

    finish()


if __name__ == "__main__":
    main()
