"""infra/: every manifest valid against real schemas, consistent with the rest, never an open cluster.

No cluster or container engine runs here, so this is what can be proven offline:

* schemas: the core kinds (CronJob, Deployment, Service, PersistentVolumeClaim, and every Ray pod
  template as a v1 PodTemplate) against Kubernetes' own OpenAPI schemas, shipped by
  ``kubernetes-validate``; ``RayCluster`` and ``RayJob`` against the ``openAPIV3Schema`` of
  KubeRay's CRDs of the release named in ``tests/data/kuberay-<version>/``. Unknown fields are
  errors in both, as with ``kubectl apply``'s strict field validation. No network is used.
* agreement: infra/README.md tells a user to apply exactly the files of infra/k8s/, and to build
  exactly the images they name; the commands parse (``ray job submit`` with Ray's own CLI parser,
  ``jobs/reindex.py`` and ``jobs/build_index.py`` against their ``--help``); the paths they use
  are on volumes that every pod running them mounts; names, ports and labels line up.
* no open cluster: token authentication on every Ray container and on the submitter, the dashboard
  never on 0.0.0.0 without it, ``RAY_AUTH_MODE=disabled`` nowhere, tokens from Secrets only.

Each checker returns a list of problems; the tests assert it is empty for the shipped manifests
and, as a control, non-empty for a broken copy.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
DOCKER = INFRA / "docker"
README = INFRA / "README.md"

KUBERAY_VERSION = "1.7.0"
CRD_DIR = ROOT / "tests" / "data" / f"kuberay-{KUBERAY_VERSION}"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
#: Oldest and newest Kubernetes the core kinds are checked against (CronJob.spec.timeZone: >= 1.27).
K8S_VERSIONS = ("1.30.0", latest_version())

REINDEX_SCRIPT = ROOT / "jobs" / "reindex.py"
BUILD_SCRIPT = ROOT / "jobs" / "build_index.py"
#: What jobs/reindex.py accepts per its contract, used only while the file does not exist.
REINDEX_CONTRACT = ({"--index": (True, None), "--corpus": (True, None), "--dense": (False, None),
                     "--keep": (True, None)}, {"--index", "--corpus"})

SECRETISH = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL", re.I)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


# -- loading -------------------------------------------------------------------------------------


def _load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


MANIFEST_FILES = sorted(K8S.glob("*.yaml"))
DOCS = [(p.name, d) for p in MANIFEST_FILES for d in _load_all(p)]
DOC_IDS = [f"{name}:{d.get('kind')}/{d.get('metadata', {}).get('name')}" for name, d in DOCS]


def _of_kind(kind: str, docs=None) -> list[dict]:
    return [d for _, d in (docs if docs is not None else DOCS) if d.get("kind") == kind]


def _one(kind: str, docs=None) -> dict:
    found = _of_kind(kind, docs)
    assert len(found) == 1, f"expected one {kind} in infra/k8s, found {len(found)}"
    return found[0]


@pytest.fixture
def no_network(monkeypatch):
    """Schema validation must work offline: any connection attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access during validation: {args!r}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# -- schemas: core kinds (kubernetes-validate) -------------------------------------------------------


def _pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(where, pod template) of every pod a manifest makes."""
    kind, spec = doc.get("kind"), doc.get("spec", {})
    if kind == "RayCluster":
        out = [("headGroupSpec", spec["headGroupSpec"]["template"])]
        out += [(f"workerGroupSpecs[{g['groupName']}]", g["template"]) for g in spec.get("workerGroupSpecs", [])]
        return out
    if kind == "RayJob":
        out = [("submitterPodTemplate", spec["submitterPodTemplate"])] if "submitterPodTemplate" in spec else []
        if "rayClusterSpec" in spec:
            out += _pod_templates({"kind": "RayCluster", "spec": spec["rayClusterSpec"]})
        return out
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [("template", spec["template"])]
    if kind == "CronJob":
        return [("jobTemplate", spec["jobTemplate"]["spec"]["template"])]
    return []


def _containers(doc: dict) -> list[tuple[str, dict]]:
    return [(f"{where}/{c['name']}", c) for where, t in _pod_templates(doc)
            for c in t["spec"].get("containers", []) + t["spec"].get("initContainers", [])]


def _core_problems(doc: dict, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,doc", [(n, d) for n, d in DOCS if not d["apiVersion"].startswith("ray.io/")],
                         ids=[i for i, (_, d) in zip(DOC_IDS, DOCS) if not d["apiVersion"].startswith("ray.io/")])
def test_core_kinds_valid_against_kubernetes_schemas(name, doc, version, no_network):
    assert _core_problems(doc, version) == [], name


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_ray_pod_templates_valid_as_kubernetes_pod_templates(version, no_network):
    """The pod templates inside the KubeRay kinds are checked by the CRD schema (which embeds a
    PodSpec) and, here, by Kubernetes' own PodTemplate schema as well."""
    checked = 0
    for name, doc in DOCS:
        if not doc["apiVersion"].startswith("ray.io/"):
            continue
        for where, template in _pod_templates(doc):
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"},
                       "template": template}
            assert _core_problems(wrapped, version) == [], f"{name} {where}"
            checked += 1
    assert checked >= 3   # the head and two worker groups at least


def test_core_validation_rejects_a_broken_manifest(no_network):
    """Control: kubernetes-validate is not vacuous (an unknown field, a wrong type)."""
    cron = copy.deepcopy(_one("CronJob"))
    cron["spec"]["concurencyPolicy"] = "Forbid"
    assert _core_problems(cron, K8S_VERSIONS[-1])
    deploy = copy.deepcopy(_one("Deployment"))
    deploy["spec"]["replicas"] = "two"
    assert _core_problems(deploy, K8S_VERSIONS[-1])


# -- schemas: KubeRay kinds (the CRDs' openAPIV3Schema) ---------------------------------------------


def _strict(schema):
    """The structural schema with unknown fields rejected where the API server would prune them
    (``kubectl apply`` validates strictly by default and then refuses them)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if isinstance(schema.get("items"), dict):
        out["items"] = _strict(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_strict(s) for s in schema[key]]
    return out


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(CRD_DIR / CRD_FILES[kind]) as f:
        crd = yaml.load(f, Loader=loader)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
    return crd


@functools.lru_cache(maxsize=None)
def _crd_validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    crd = _crd(kind)
    group, _, version = api_version.partition("/")
    assert group == crd["spec"]["group"], f"{kind}: apiVersion {api_version} is not of group {crd['spec']['group']}"
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            assert v["served"] and not v.get("deprecated"), f"{kind} {api_version} is not served or deprecated"
            return jsonschema.Draft7Validator(_strict(v["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"KubeRay {KUBERAY_VERSION} has no {kind} {api_version}")


def _crd_problems(doc: dict) -> list[str]:
    validator = _crd_validator(doc["kind"], doc["apiVersion"])
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in validator.iter_errors(doc))


RAY_DOCS = [(n, d) for n, d in DOCS if d["apiVersion"].startswith("ray.io/")]


@pytest.mark.parametrize("name,doc", RAY_DOCS, ids=[i for i, (_, d) in zip(DOC_IDS, DOCS)
                                                    if d["apiVersion"].startswith("ray.io/")])
def test_kuberay_kinds_valid_against_crd_schemas(name, doc, no_network):
    assert doc["kind"] in CRD_FILES, f"{name}: no CRD schema kept for {doc['kind']}"
    assert _crd_problems(doc) == [], name


def test_every_kind_has_a_schema():
    kinds = {d["kind"] for _, d in DOCS}
    assert {"RayCluster", "RayJob", "CronJob", "Deployment", "Service"} <= kinds
    for _, d in DOCS:
        assert d["kind"] in CRD_FILES or not d["apiVersion"].startswith("ray.io/"), d["kind"]


def test_crd_validation_rejects_a_broken_manifest(no_network):
    """Control: a misspelt field, a wrong type and a bad enum value are each caught."""
    cluster = copy.deepcopy(_one("RayCluster"))
    cluster["spec"]["authOption"] = cluster["spec"].pop("authOptions")
    assert any("authOption" in p for p in _crd_problems(cluster))
    cluster = copy.deepcopy(_one("RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = "four"
    assert _crd_problems(cluster)
    cluster = copy.deepcopy(_one("RayCluster"))
    cluster["spec"]["authOptions"]["mode"] = "password"
    assert _crd_problems(cluster)
    cluster = copy.deepcopy(_one("RayCluster"))
    cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert _crd_problems(cluster)
    job = copy.deepcopy(_one("RayJob"))
    job["spec"]["entryPoint"] = job["spec"].pop("entrypoint")
    assert _crd_problems(job)


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_crd_schemas_are_the_named_release_unmodified():
    notes = (CRD_DIR / "README.md").read_text()
    assert f"v{KUBERAY_VERSION}" in notes
    assert re.search(r"\bcommit \**([0-9a-f]{40})\b", notes), "the README names the commit"
    for kind, fname in CRD_FILES.items():
        row = re.search(rf"`{re.escape(fname)}` \| `([0-9a-f]{{40}})`", notes)
        assert row, f"{fname}: no blob sha1 in {CRD_DIR.name}/README.md"
        data = (CRD_DIR / fname).read_bytes()
        assert _git_blob_sha1(data) == row.group(1), f"{fname} differs from KubeRay v{KUBERAY_VERSION}'s"
        assert len(data) < 2 * 1024 * 1024


# -- no open cluster -------------------------------------------------------------------------------


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_ref(env_entry: dict | None) -> tuple[str, str] | None:
    ref = ((env_entry or {}).get("valueFrom") or {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref and "value" not in env_entry else None


def _ray_token_problems(where: str, container: dict, secret: str | None) -> list[str]:
    env, out = _env(container), []
    if (env.get("RAY_AUTH_MODE") or {}).get("value") != "token":
        out.append(f"{where}: RAY_AUTH_MODE is not 'token'")
    ref = _secret_ref(env.get("RAY_AUTH_TOKEN"))
    if ref is None:
        out.append(f"{where}: RAY_AUTH_TOKEN does not come from a Secret")
    elif secret is not None and ref != (secret, "auth_token"):
        out.append(f"{where}: RAY_AUTH_TOKEN from {ref}, not the cluster's Secret ({secret!r}, 'auth_token')")
    return out


def _open_cluster_problems(cluster: dict) -> list[str]:
    """Why this RayCluster would accept jobs from anyone who reaches it (empty: it would not)."""
    spec, out = cluster["spec"], []
    auth = spec.get("authOptions") or {}
    secret = auth.get("secretName")
    if auth.get("mode") != "token":
        out.append("authOptions.mode is not 'token' (the operator would not authenticate to the dashboard)")
    if not secret:
        out.append("authOptions.secretName unset (KubeRay would generate a token nobody else has)")
    # KubeRay makes the dashboard listen on 0.0.0.0 unless told otherwise.
    host = str(spec["headGroupSpec"].get("rayStartParams", {}).get("dashboard-host", "0.0.0.0"))
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
    token_problems = [p for name, g in groups for c in g["template"]["spec"]["containers"]
                      for p in _ray_token_problems(f"{name}/{c['name']}", c, secret)]
    out += token_problems
    if host not in LOOPBACK and (token_problems or auth.get("mode") != "token"):
        out.append(f"dashboard-host {host}: the job-submission API is reachable without a token")
    return out


def test_ray_cluster_requires_a_token():
    assert _open_cluster_problems(_one("RayCluster")) == []


def test_open_cluster_check_catches_what_was_shipped_before():
    """Control: the manifest as it was (dashboard on 0.0.0.0, no auth) and partial fixes fail."""
    before = copy.deepcopy(_one("RayCluster"))
    del before["spec"]["authOptions"]
    for g in [before["spec"]["headGroupSpec"]] + before["spec"]["workerGroupSpecs"]:
        for c in g["template"]["spec"]["containers"]:
            c.pop("env", None)
    problems = _open_cluster_problems(before)
    assert any("dashboard-host 0.0.0.0" in p for p in problems)
    one_worker_open = copy.deepcopy(_one("RayCluster"))
    one_worker_open["spec"]["workerGroupSpecs"][-1]["template"]["spec"]["containers"][0]["env"][0]["value"] = "disabled"
    assert _open_cluster_problems(one_worker_open)
    inlined = copy.deepcopy(_one("RayCluster"))
    inlined["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][1] = {
        "name": "RAY_AUTH_TOKEN", "value": "0123456789abcdef"}
    assert _open_cluster_problems(inlined)


def test_submitters_authenticate_with_the_cluster_token():
    cluster = _one("RayCluster")
    secret = cluster["spec"]["authOptions"]["secretName"]
    cron = _one("CronJob")
    for where, c in _containers(cron):
        assert _ray_token_problems(f"CronJob {where}", c, secret) == []
    # The RayJob's submitter pod is made by the operator, which puts the cluster's token into it
    # (authOptions); a submitterPodTemplate of our own would have to carry it itself.
    job = _one("RayJob")
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    assert "rayClusterSpec" not in job["spec"]
    for where, c in _containers(job):
        assert _ray_token_problems(f"RayJob {where}", c, secret) == []


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")
    yield path, node


def _auth_disabled_problems(docs, dockerfiles: dict[str, str]) -> list[str]:
    out = []
    for name, doc in docs:
        for path, node in _walk(doc):
            if isinstance(node, dict) and node.get("name") == "RAY_AUTH_MODE" and node.get("value") != "token":
                out.append(f"{name}{path}: RAY_AUTH_MODE={node.get('value') or node.get('valueFrom')!r}")
            if path.endswith("/authOptions") and isinstance(node, dict) and node.get("mode", "token") != "token":
                out.append(f"{name}{path}: authOptions.mode={node['mode']!r}")
            if isinstance(node, str) and re.search(r"RAY_AUTH_MODE\s*=\s*['\"]?(?!token\b)\w+", node):
                out.append(f"{name}{path}: {node!r}")
    for name, text in dockerfiles.items():
        for line in text.splitlines():
            if not line.lstrip().startswith("#") and re.search(r"RAY_AUTH_MODE", line):
                out.append(f"{name}: sets RAY_AUTH_MODE in the image ({line.strip()!r}); the manifests set it")
    return out


def _dockerfiles() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(DOCKER.glob("Dockerfile.*")) if not p.name.endswith(".dockerignore")}


def test_auth_is_never_disabled():
    assert _auth_disabled_problems(DOCS, _dockerfiles()) == []


def test_auth_disabled_check_catches_the_old_cronjob_and_image():
    cron = copy.deepcopy(_one("CronJob"))
    c = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    c["env"] = [{"name": "RAY_AUTH_MODE", "value": "disabled"}]
    assert _auth_disabled_problems([("cronjob", cron)], {})
    assert _auth_disabled_problems([], {"Dockerfile.cpu": "FROM x\nENV RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1\n"})
    shell = copy.deepcopy(_one("CronJob"))
    shell["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "sh", "-c", "RAY_AUTH_MODE=disabled ray job submit -- python jobs/reindex.py"]
    assert _auth_disabled_problems([("cronjob", shell)], {})


def _inlined_secret_problems(docs) -> list[str]:
    out = []
    for name, doc in docs:
        if doc.get("kind") == "Secret":
            out.append(f"{name}: a Secret in a manifest (create it with kubectl, see infra/README.md)")
        for where, c in _containers(doc):
            for e in c.get("env", []):
                if SECRETISH.search(e["name"]) and _secret_ref(e) is None:
                    out.append(f"{name} {where}: {e['name']} is not taken from a Secret")
            argv = [str(a) for a in c.get("command", []) + c.get("args", [])]
            for i, a in enumerate(argv):
                if a.startswith("--token") or a.startswith("--auth-token"):
                    out.append(f"{name} {where}: token on the command line ({a})")
        if doc.get("kind") == "RayJob" and re.search(r"--token\b|RAY_AUTH_TOKEN=", doc["spec"].get("entrypoint", "")):
            out.append(f"{name}: token in the RayJob entrypoint")
    return out


def test_secrets_are_referenced_not_inlined():
    assert _inlined_secret_problems(DOCS) == []


def test_inlined_secret_check_catches_inlined_tokens():
    serve = copy.deepcopy(_one("Deployment"))
    serve["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "FUNNEL_TOKEN", "value": "abc"}]
    assert _inlined_secret_problems([("serving", serve)])
    serve = copy.deepcopy(_one("Deployment"))
    serve["spec"]["template"]["spec"]["containers"][0]["command"] += ["--token", "abc"]
    assert _inlined_secret_problems([("serving", serve)])
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}, "stringData": {"token": "abc"}}
    assert _inlined_secret_problems([("secret", secret)])


def _readme_secrets() -> set[tuple[str, str]]:
    """(name, key) of every Secret infra/README.md tells a user to create."""
    text = README.read_text().replace("\\\n", " ")
    return {(m.group(1), m.group(2))
            for m in re.finditer(r"kubectl create secret generic (\S+)\s+--from-literal=([\w.-]+)=", text)}


def test_every_secret_referenced_is_created_by_the_readme():
    referenced = {ref for _, d in DOCS for _, c in _containers(d)
                  for e in c.get("env", []) if (ref := _secret_ref(e))}
    for cluster in _of_kind("RayCluster"):
        referenced.add((cluster["spec"]["authOptions"]["secretName"], "auth_token"))
    created = _readme_secrets()
    assert referenced and referenced <= created, f"not created by infra/README.md: {referenced - created}"
    assert created <= referenced, f"created but used by no manifest: {created - referenced}"


# -- the scheduled reindex and the build ------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _script_options(script: Path) -> tuple[dict[str, tuple[bool, frozenset | None]], frozenset]:
    """({--option: (takes a value, choices or None)}, required options) from ``SCRIPT --help``."""
    run = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"{script.name} --help failed:\n{run.stderr[-2000:]}"
    text = run.stdout
    usage, _, rest = text.partition("\n\n")
    optional = usage
    while (stripped := re.sub(r"\[[^\[\]]*\]", "", optional)) != optional:
        optional = stripped
    required = frozenset(re.findall(r"(?<![\w-])(--[\w-]+)", optional))
    options: dict[str, tuple[bool, frozenset | None]] = {}
    for line in rest.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if not m:
            continue
        for item in m.group(1).split(", "):
            name, _, metavar = item.partition(" ")
            choices = frozenset(metavar[1:-1].split(",")) if metavar.startswith("{") else None
            options[name] = (bool(metavar), choices)
    assert "--help" in options and required <= set(options), (script.name, required, sorted(options))
    return options, required


def _reindex_options():
    if REINDEX_SCRIPT.exists():
        return _script_options(REINDEX_SCRIPT)
    options, required = REINDEX_CONTRACT
    return options, frozenset(required)


def _argv_problems(argv: list[str], options, required) -> list[str]:
    out, seen, i = [], set(), 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if not name.startswith("--") or name not in options:
            out.append(f"unknown argument {token!r}")
            i += 1
            continue
        takes_value, choices = options[name]
        seen.add(name)
        if takes_value and not eq:
            i += 1
            if i >= len(argv) or argv[i].startswith("--"):
                out.append(f"{name} needs a value")
                continue
            value = argv[i]
        elif not takes_value and eq:
            out.append(f"{name} takes no value")
        if takes_value and choices and value not in choices:
            out.append(f"{name} {value!r} not one of {sorted(choices)}")
        i += 1
    out += [f"missing {r}" for r in sorted(required - seen)]
    return out


def _opt(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            return argv[i + 1]
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _image_workdir() -> str:
    workdirs = {re.findall(r"^WORKDIR\s+(\S+)", text, re.M)[-1] for text in _dockerfiles().values()}
    assert len(workdirs) == 1, f"the images disagree on WORKDIR: {workdirs}"
    return workdirs.pop()


def _script_in_image(path: str, script: str) -> list[str]:
    """The command names the repository's ``jobs/<script>`` as the image holds it."""
    workdir = _image_workdir().rstrip("/")
    ok = {f"jobs/{script}", f"{workdir}/jobs/{script}"}
    return [] if path in ok else [f"{path!r} is not jobs/{script} in the image ({sorted(ok)})"]


def _submit(cron: dict) -> tuple[dict, list[str]]:
    """Ray's own CLI parser on the CronJob's `ray job submit ...`: (its params, the entrypoint)."""
    from ray.dashboard.modules.job.cli import submit
    [(_, container)] = _containers(cron)
    argv = [str(a) for a in container.get("command", []) + container.get("args", [])]
    assert argv[:3] == ["ray", "job", "submit"], argv
    ctx = submit.make_context("submit", argv[3:])
    return ctx.params, list(ctx.params["entrypoint"])


def _cronjob_problems(cron: dict, cluster: dict) -> list[str]:
    spec, out = cron["spec"], []
    if spec.get("concurrencyPolicy") != "Forbid":
        out.append(f"concurrencyPolicy {spec.get('concurrencyPolicy')!r}, not 'Forbid'")
    if spec["jobTemplate"]["spec"].get("backoffLimit") != 0:
        out.append("backoffLimit is not 0: a failed reindex would be resubmitted")
    params, entry = _submit(cron)
    if params["no_wait"]:
        out.append("--no-wait: the pod would end before the reindex, and Forbid would not hold")
    head_svc = f"http://{cluster['metadata']['name']}-head-svc:8265"
    if params["address"] != head_svc:
        out.append(f"--address {params['address']!r}, not the cluster's head Service {head_svc!r}")
    if params["working_dir"] or params["runtime_env"] or params["runtime_env_json"]:
        out.append("uploads a runtime env: the job must run the image's own code")
    if entry[:1] != ["python"] or len(entry) < 2:
        out.append(f"entrypoint {entry!r} is not `python jobs/reindex.py ...`")
        return out
    out += _script_in_image(entry[1], "reindex.py")
    out += _argv_problems(entry[2:], *_reindex_options())
    return out


def test_cronjob_submits_the_reindex():
    assert _cronjob_problems(_one("CronJob"), _one("RayCluster")) == []


def test_cronjob_check_catches_the_old_cronjob():
    """Control: the CronJob as it was ran a full build, and wrong flags are caught."""
    cluster = _one("RayCluster")
    old = copy.deepcopy(_one("CronJob"))
    c = old["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    c["command"] = ["ray", "job", "submit", "--address", "http://funnel-head-svc:8265", "--", "python",
                    "jobs/build_index.py", "--corpus", "/data/corpus", "--out", "/indexes/main", "--shards", "64",
                    "--dense", "--keep-versions", "3"]
    assert _cronjob_problems(old, cluster)
    for bad in (["--index", "/indexes/main", "--corpus", "/data/corpus", "--keep"],      # no value
                ["--index", "/indexes/main", "--corpus", "/data/corpus", "--shards", "4"],  # not a reindex flag
                ["--corpus", "/data/corpus"]):                                           # --index missing
        c["command"] = ["ray", "job", "submit", "--address", "http://funnel-head-svc:8265", "--", "python",
                        "jobs/reindex.py", *bad]
        assert _cronjob_problems(old, cluster), bad
    allow = copy.deepcopy(_one("CronJob"))
    allow["spec"]["concurrencyPolicy"] = "Allow"
    assert _cronjob_problems(allow, cluster)
    nowait = copy.deepcopy(_one("CronJob"))
    nowait["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"].insert(3, "--no-wait")
    assert _cronjob_problems(nowait, cluster)


def _build_argv(job: dict) -> list[str]:
    entry = shlex.split(job["spec"]["entrypoint"])
    assert entry[:1] == ["python"] and len(entry) > 1, entry
    return entry


def test_rayjob_runs_the_build():
    entry = _build_argv(_one("RayJob"))
    assert _script_in_image(entry[1], "build_index.py") == []
    assert _argv_problems(entry[2:], *_script_options(BUILD_SCRIPT)) == []
    assert _one("RayJob")["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode"  # clusterSelector needs it


def test_reindex_updates_the_index_the_build_publishes():
    build = _build_argv(_one("RayJob"))[2:]
    _, reindex = _submit(_one("CronJob"))
    reindex = reindex[2:]
    assert _opt(reindex, "--index") == _opt(build, "--out")
    assert _opt(reindex, "--corpus") == _opt(build, "--corpus")
    assert _opt(reindex, "--keep", "--keep-versions") == _opt(build, "--keep-versions")


# -- volumes, names, ports, images -----------------------------------------------------------------------


def _mounts(template: dict, container: dict) -> dict[str, dict]:
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        assert m["name"] in volumes, f"volumeMount {m['name']!r} has no volume"
        out[m["mountPath"].rstrip("/")] = {**m, "volume": volumes[m["name"]]}
    return out


def _on_mount(path: str, mounts: dict[str, dict]) -> dict | None:
    for mount_path, m in mounts.items():
        if path == mount_path or path.startswith(mount_path + "/"):
            return m
    return None


def test_paths_the_jobs_use_are_on_every_ray_node():
    """The build and the reindex run on the head (the driver) and the workers (tasks): each path
    they read or write is on a volume every Ray container mounts, writable where written."""
    cluster = _one("RayCluster")
    build = _build_argv(_one("RayJob"))[2:]
    _, reindex = _submit(_one("CronJob"))
    written = {_opt(build, "--out"), _opt(reindex[2:], "--index")}
    read = {_opt(build, "--corpus"), _opt(reindex[2:], "--corpus")}
    spec = cluster["spec"]
    for group in [spec["headGroupSpec"]] + spec["workerGroupSpecs"]:
        template = group["template"]
        for c in template["spec"]["containers"]:
            mounts = _mounts(template, c)
            for path in written | read:
                m = _on_mount(path, mounts)
                assert m, f"{c['name']}: {path} is on no volume"
                assert not (path in written and m.get("readOnly")), f"{c['name']}: {path} is read-only"


def test_claims_are_defined_and_shared():
    claims = {d["metadata"]["name"]: d for d in _of_kind("PersistentVolumeClaim")}
    used = {v["persistentVolumeClaim"]["claimName"] for _, d in DOCS for _, t in _pod_templates(d)
            for v in t["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    assert used and used <= set(claims), f"claims used but not defined in infra/k8s: {used - set(claims)}"
    for name in used:   # mounted by pods on different nodes at once
        assert "ReadWriteMany" in claims[name]["spec"]["accessModes"], name


def test_serving_is_wired_and_authenticated():
    deploy, service = _one("Deployment"), _one("Service")
    template = deploy["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    [c] = template["spec"]["containers"]
    argv = c["command"] + c.get("args", [])
    assert argv[:2] == ["funnel", "serve"] and "--insecure" not in argv
    port = int(_opt(argv, "--port") or 8765)
    assert [p["containerPort"] for p in c["ports"]] == [port]
    assert [p["targetPort"] for p in service["spec"]["ports"]] in ([port], [c["ports"][0].get("name")])
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}   # /health needs no token
    assert _secret_ref(_env(c).get("FUNNEL_TOKEN")), "FUNNEL_TOKEN must come from a Secret"
    index = argv[2]
    mount = _on_mount(index, _mounts(template, c))
    assert mount and mount.get("readOnly"), f"{index} not on a read-only mount"
    build_out = _opt(_build_argv(_one("RayJob"))[2:], "--out")
    assert index == build_out, "serving reads another index than the build writes"
    ray_head = _one("RayCluster")["spec"]["headGroupSpec"]["template"]
    ray_index = _on_mount(build_out, _mounts(ray_head, ray_head["spec"]["containers"][0]))
    assert mount["volume"].get("persistentVolumeClaim") == ray_index["volume"].get("persistentVolumeClaim"), \
        "serving mounts another volume than the one the build writes"


def test_images_are_built_as_the_readme_says():
    text = README.read_text()
    built = {tag: df for df, tag in re.findall(r"docker build -f infra/docker/(\S+) -t (\S+) \.", text)}
    images = {c["image"] for _, d in DOCS for _, c in _containers(d)}
    assert images and images <= set(built), f"images no README command builds: {images - set(built)}"
    dockerfiles = _dockerfiles()
    assert set(built.values()) == set(dockerfiles), (built, sorted(dockerfiles))
    ray_version = _one("RayCluster")["spec"]["rayVersion"]
    for name, text_ in dockerfiles.items():
        base = re.findall(r"^FROM\s+(\S+)", text_, re.M)
        assert base and base[0].startswith(f"rayproject/ray:{ray_version}-"), (name, base, ray_version)
        ignore = DOCKER / f"{name}.dockerignore"
        assert ignore.exists(), f"{ignore.name} missing: the build context would include .venv"
        ignored = {ln.strip() for ln in ignore.read_text().splitlines()}
        assert {".venv", ".git", ".funnel"} <= ignored


def _readme_applied() -> list[str]:
    return re.findall(r"^kubectl apply -f infra/k8s/(\S+\.yaml)\s*$", README.read_text(), re.M)


def test_readme_applies_exactly_the_manifests():
    applied = _readme_applied()
    assert sorted(applied) == sorted(p.name for p in MANIFEST_FILES), applied
    assert len(applied) == len(set(applied))
    order = {name: i for i, name in enumerate(applied)}
    # Volumes before the pods that mount them; the cluster before the jobs that run on it.
    assert order["volumes.yaml"] < order["raycluster.yaml"] < order["rayjob-build.yaml"]
    assert order["raycluster.yaml"] < order["cronjob-reindex.yaml"]
    assert "## Deploying" in README.read_text()


def test_top_readme_points_only_at_existing_infra_files():
    text = (ROOT / "README.md").read_text()
    for path in set(re.findall(r"\binfra/[\w./-]+", text)):
        assert (ROOT / path.rstrip(".")).exists(), path
