//! deploy/kubernetes/rl-relay.yaml, Istio's rate limit sample with rl-relay:
//! well-formed YAML whose objects hang together (selectors, ports, the
//! config volume), an environment the relay reads as upstream's with
//! nothing refused or unserved, a config it loads, and the images at the
//! workspace's version.

mod support;

use std::collections::BTreeMap;

use rl_relay::rls::config::RlsConfig;
use rl_relay::rls::upstream_env::translate;
use support::{repo_file, version};
use yaml_rust2::{Yaml, YamlLoader};

fn str_at<'a>(y: &'a Yaml, path: &[&str]) -> &'a str {
    at(y, path).as_str().unwrap_or_else(|| panic!("{path:?}: not a string"))
}

fn at<'a>(y: &'a Yaml, path: &[&str]) -> &'a Yaml {
    let mut node = y;
    for key in path {
        node = &node[*key];
        assert!(!node.is_badvalue(), "{path:?}: no {key}");
    }
    node
}

fn list<'a>(y: &'a Yaml, path: &[&str]) -> &'a Vec<Yaml> {
    at(y, path).as_vec().unwrap_or_else(|| panic!("{path:?}: not a list"))
}

fn labels(y: &Yaml) -> BTreeMap<String, String> {
    y.as_hash()
        .unwrap_or_else(|| panic!("{y:?}: not a map"))
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_string(), v.as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn the_relay_manifest_hangs_together() {
    let docs = YamlLoader::load_from_str(&repo_file("deploy/kubernetes/rl-relay.yaml")).expect("well-formed YAML");
    let find = |kind: &str, name: &str| -> &Yaml {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let kinds: Vec<(&str, &str)> =
        docs.iter().map(|d| (str_at(d, &["kind"]), str_at(d, &["metadata", "name"]))).collect();
    assert_eq!(
        kinds,
        [
            ("ConfigMap", "ratelimit-config"),
            ("Service", "redis"),
            ("Deployment", "redis"),
            ("Service", "ratelimit"),
            ("Deployment", "ratelimit"),
        ]
    );
    for d in &docs {
        let api = str_at(d, &["apiVersion"]);
        let want = if str_at(d, &["kind"]) == "Deployment" { "apps/v1" } else { "v1" };
        assert_eq!(api, want, "{d:?}");
    }

    // Each Service selects its Deployment's pods, on ports its container opens.
    for name in ["redis", "ratelimit"] {
        let (service, deployment) = (find("Service", name), find("Deployment", name));
        let pod_labels = labels(at(deployment, &["spec", "template", "metadata", "labels"]));
        assert_eq!(labels(at(deployment, &["spec", "selector", "matchLabels"])), pod_labels, "{name}");
        assert_eq!(labels(at(service, &["spec", "selector"])), pod_labels, "{name}");
        let container = &list(deployment, &["spec", "template", "spec", "containers"])[0];
        let open: Vec<i64> =
            list(container, &["ports"]).iter().map(|p| at(p, &["containerPort"]).as_i64().unwrap()).collect();
        for port in list(service, &["spec", "ports"]) {
            let target = port["targetPort"].as_i64().unwrap_or_else(|| at(port, &["port"]).as_i64().unwrap());
            assert!(open.contains(&target), "{name}: Service port {target} not among {open:?}");
        }
        assert_eq!(
            at(deployment, &["spec", "template", "spec", "securityContext", "runAsNonRoot"]).as_bool(),
            Some(true)
        );
    }

    // The relay: the image at this version, /bin/ratelimit with no argument.
    let relay = find("Deployment", "ratelimit");
    let container = &list(relay, &["spec", "template", "spec", "containers"])[0];
    assert_eq!(str_at(container, &["image"]), format!("rl-relay:{}", version()));
    let command: Vec<&str> = list(container, &["command"]).iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(command, ["/bin/ratelimit"]);
    assert!(container["args"].is_badvalue(), "no argument: the relay reads upstream's environment only then");
    let redis = &list(find("Deployment", "redis"), &["spec", "template", "spec", "containers"])[0];
    assert_eq!(str_at(redis, &["image"]), format!("redis-rl:{}", version()));

    // Its environment, read as the relay reads it: nothing refused, nothing
    // named as not served, Redis at the redis Service, and the config folder
    // where the ConfigMap is mounted.
    let env: BTreeMap<String, String> = list(container, &["env"])
        .iter()
        .map(|e| (str_at(e, &["name"]).to_string(), str_at(e, &["value"]).to_string()))
        .collect();
    let translated = translate(&|name| env.get(name).cloned()).expect("the relay accepts the environment");
    assert_eq!(translated.warning(), None, "a variable set and not served");
    let args = translated.args(&[]);
    let flag = |name: &str| -> String {
        let i = args.iter().position(|a| a == name).unwrap_or_else(|| panic!("{name} not in {args:?}"));
        args[i + 1].clone()
    };
    assert_eq!(flag("--redis"), "redis://redis:6379/");
    let mount = list(container, &["volumeMounts"])
        .iter()
        .find(|m| str_at(m, &["name"]) == "config-volume")
        .map(|m| str_at(m, &["mountPath"]).to_string())
        .expect("the config volume mounted");
    assert_eq!(flag("--rls-config"), mount);
    let volume = list(relay, &["spec", "template", "spec", "volumes"])
        .iter()
        .find(|v| str_at(v, &["name"]) == "config-volume")
        .expect("the config volume");
    assert_eq!(str_at(volume, &["configMap", "name"]), "ratelimit-config");
    // The probes on the port the relay serves /healthcheck and /live on.
    let metrics_port = flag("--metrics").rsplit(':').next().unwrap().parse::<i64>().unwrap();
    for (probe, path) in [("readinessProbe", "/healthcheck"), ("livenessProbe", "/live")] {
        assert_eq!(str_at(container, &[probe, "httpGet", "path"]), path);
        assert_eq!(at(container, &[probe, "httpGet", "port"]).as_i64(), Some(metrics_port));
    }
    let grpc_port = flag("--rls-listen").rsplit(':').next().unwrap().parse::<i64>().unwrap();
    let service_ports: Vec<i64> =
        list(find("Service", "ratelimit"), &["spec", "ports"]).iter().map(|p| p["port"].as_i64().unwrap()).collect();
    assert_eq!(service_ports, [metrics_port, grpc_port]);

    // The ConfigMap's files load as the relay's config.
    let data = at(find("ConfigMap", "ratelimit-config"), &["data"]).as_hash().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in data {
        std::fs::write(dir.path().join(name.as_str().unwrap()), text.as_str().unwrap()).unwrap();
    }
    let config = RlsConfig::load(dir.path(), false).unwrap_or_else(|e| panic!("the ConfigMap's config: {e:?}"));
    assert_eq!(config.files, ["config.yaml"]);
}
