#!/usr/bin/env python3
"""Adapts manifests rendered by `kubectl kustomize` to what `podman kube play` (4.3) can run here.

    kubectl kustomize DIR | tests/deploy/adapt.py [options] > FILE.yaml

Only what a cluster would provide and podman does not is changed; the pod specs, the generated
ConfigMaps and the onceproxy configs in them stay as rendered:
  --image FROM=TO         image repository FROM (tag ignored) becomes TO (a local tag); no
                          registry is reachable here
  --keep KIND/NAME        keep only these objects (repeatable, globs: ConfigMap/*; default: all)
  --drop-kind KIND        drop every object of KIND (Services: podman has no cluster IPs or DNS)
  --rename OLD=NEW        rename a Deployment (podman plays one pod per Deployment, so a second
                          replica is the same Deployment played under another name)
  --host-alias NAME=IP    add a hostAliases entry to every pod template (stands in for a
                          Service's DNS name)
  --env CONTAINER:NAME=V  set an env var of a container (replaces a valueFrom)
  --command CONTAINER=JSON  set a container's command (a JSON list)
  --restart-policy P      the pods' restartPolicy (Never: podman restarts a container that
                          exits after SIGTERM, which the kubelet does not do in a terminating
                          pod)
  --secrets-to DIR        write every Secret as DIR/NAME.json and drop it: podman 4.3's kube
                          play stores a played Secret as YAML, but its secretKeyRef lookup
                          reads a JSON object of base64 values ({"key": "base64"}), so the test
                          creates the podman secrets from these files instead
                          (`podman secret create NAME FILE`)
  Container ports are removed (named probe ports replaced by their numbers): podman 4.3's kube
  play publishes every containerPort on the host's 0.0.0.0 and a second pod with the same port
  fails; the pods are reached through their network namespaces instead.
  $(NAME) in a container's command and args is expanded from its env (literal values and
  secretKeyRefs to Secrets of the same input), as the kubelet does and podman 4.3 does not.
  --list-volumes          print the names of the volumes kube play creates (ConfigMaps,
                          PersistentVolumeClaims) instead of the manifests: `podman kube down`
                          (4.3) leaves them behind
"""
import argparse
import base64
import fnmatch
import json
import os
import re
import sys

import yaml


def pair(text, sep="="):
    a, _, b = text.partition(sep)
    if not a or not b:
        raise argparse.ArgumentTypeError(f"expected A{sep}B, got {text!r}")
    return a, b


def expand_args(container, secret_values):
    values = {}
    for e in container.get("env", []):
        if "value" in e:
            values[e["name"]] = e["value"]
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref and (ref["name"], ref["key"]) in secret_values:
            values[e["name"]] = secret_values[(ref["name"], ref["key"])]
    for field in ("command", "args"):
        if field in container:
            container[field] = [
                re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                       lambda m: values.get(m.group(1), m.group(0)), str(a))
                for a in container[field]]


def unpublish_ports(container):
    numbers = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        action = container.get(probe) or {}
        for kind in ("httpGet", "tcpSocket"):
            if kind in action and action[kind].get("port") in numbers:
                action[kind]["port"] = numbers[action[kind]["port"]]
    container.pop("ports", None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=pair, action="append", default=[])
    ap.add_argument("--keep", action="append", default=[])
    ap.add_argument("--drop-kind", action="append", default=[])
    ap.add_argument("--rename", type=pair, action="append", default=[])
    ap.add_argument("--host-alias", type=pair, action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--command", type=pair, action="append", default=[])
    ap.add_argument("--secrets-to")
    ap.add_argument("--restart-policy")
    ap.add_argument("--list-volumes", action="store_true")
    args = ap.parse_args()

    images = dict(args.image)
    renames = dict(args.rename)
    commands = {name: json.loads(text) for name, text in args.command}
    out = []
    secret_values = {}  # (secret, key) -> value, for $(NAME) expansion
    for doc in yaml.safe_load_all(sys.stdin):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in args.drop_kind:
            continue
        if args.keep and not any(fnmatch.fnmatchcase(f"{kind}/{name}", k) for k in args.keep):
            continue
        if kind == "Secret":
            for key, value in (doc.get("data") or {}).items():
                secret_values[(name, key)] = base64.b64decode(value).decode()
            for key, value in (doc.get("stringData") or {}).items():
                secret_values[(name, key)] = value
        if kind == "Secret" and args.secrets_to:
            data = dict(doc.get("data") or {})
            for key, value in (doc.get("stringData") or {}).items():
                data[key] = base64.b64encode(value.encode()).decode()
            with open(os.path.join(args.secrets_to, name + ".json"), "w") as f:
                json.dump(data, f)
            continue
        if kind == "Deployment":
            doc["metadata"]["name"] = renames.get(name, name)
            pod = doc["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod.get("containers", []):
                repo, colon, tag = c["image"].rpartition(":")
                if not colon or "/" in tag:
                    repo = c["image"]
                if repo in images:
                    c["image"] = images[repo]
                if c["name"] in commands:
                    c["command"] = commands[c["name"]]
                    c.pop("args", None)
                expand_args(c, secret_values)
                unpublish_ports(c)
            for spec in args.env:
                cname, var = spec.split(":", 1)
                var_name, value = pair(var)
                for c in pod.get("initContainers", []) + pod.get("containers", []):
                    if c["name"] != cname:
                        continue
                    env = [e for e in c.get("env", []) if e["name"] != var_name]
                    env.append({"name": var_name, "value": value})
                    c["env"] = env
            if args.restart_policy:
                pod["restartPolicy"] = args.restart_policy
            if args.host_alias:
                pod["hostAliases"] = [{"ip": ip, "hostnames": [host]}
                                      for host, ip in args.host_alias]
        out.append(doc)
    if args.list_volumes:
        for doc in out:
            if doc["kind"] in ("ConfigMap", "PersistentVolumeClaim"):
                print(doc["metadata"]["name"])
        return
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
