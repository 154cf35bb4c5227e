//! The config over xDS (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW,
//! as Envoy Gateway deploys it): an ADS client, state of the world, on
//! `envoy.service.discovery.v3.AggregatedDiscoveryService/
//! StreamAggregatedResources`, asking for [`TYPE_URL`] as node
//! `--rls-xds-node-id` with its metadata and extra headers, over TLS or
//! mutual TLS when asked.
//!
//! Each version received is read by the config files' loader (each
//! `RateLimitConfig` as the YAML file it stands for, `xds_proto.rs`) and,
//! when good, put in force at once and ACKed with its version and nonce
//! (`rl_relay_rls_xds_versions_applied_total`); a bad one is NACKed with
//! what is wrong in `error_detail`, logged (rate limited), counted
//! (`rl_relay_rls_xds_nacks_total`, `ratelimit_service_config_load_error`),
//! and the config in force kept. A stream or server that fails is
//! reconnected after a backoff (doubled up to its maximum, jittered, reset
//! by a stream that delivered a version); the config in force stays
//! meanwhile, and `rl_relay_rls_xds_connected` says whether a stream is
//! open. Until a first version is applied the front is not ready, unless
//! started without a config (FORCE_START_WITHOUT_INITIAL_CONFIG).

use std::fmt;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use tonic::metadata::{AsciiMetadataValue, MetadataKey, MetadataMap};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::config::{cut, ConfigError, RlsConfig, MAX_TOTAL_BYTES};
use super::xds_proto::{RateLimitConfig, TYPE_URL};
use super::Rls;
use crate::logging::{line, Throttled};
use crate::tls::read;

/// TLS to the xDS server: its CA (else the system's roots), the DNS name
/// its certificate must be valid for (else the URL's host), and the
/// client certificate for mutual TLS.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub san: Option<String>,
}

/// How the config is fetched over xDS.
#[derive(Clone)]
pub struct XdsOptions {
    /// `host:port` (or a URL with its scheme).
    pub url: String,
    pub node_id: String,
    pub node_metadata: Vec<(String, String)>,
    /// Sent with the stream (their values may be credentials: never logged).
    pub headers: Vec<(String, String)>,
    pub tls: Option<ClientTls>,
    /// The wait after a connection that failed (jittered).
    pub connect_retry: Duration,
    /// The wait after a stream that failed, doubled each time up to the
    /// maximum (jittered).
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The largest response read.
    pub max_message_bytes: usize,
    /// Ready before the first version (FORCE_START_WITHOUT_INITIAL_CONFIG).
    pub force_start: bool,
}

/// The headers' names only.
impl fmt::Debug for XdsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdsOptions")
            .field("url", &self.url)
            .field("node_id", &self.node_id)
            .field("node_metadata", &self.node_metadata)
            .field("headers", &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("tls", &self.tls)
            .field("connect_retry", &self.connect_retry)
            .field("backoff_initial", &self.backoff_initial)
            .field("backoff_max", &self.backoff_max)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("force_start", &self.force_start)
            .finish()
    }
}

/// `k1=v1,k2=v2` (`sep` '=') or `k1:v1,k2:v2` (':'), as upstream reads its
/// node metadata and its extra headers; an entry without `sep` refused,
/// named by its text (by its place when `secret`: a header may be a
/// credential).
pub fn pairs(flag: &str, text: &str, sep: char, secret: bool) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .filter(|entry| !entry.trim().is_empty())
        .enumerate()
        .map(|(i, entry)| match entry.split_once(sep) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => {
                let shown = if secret { format!("entry {}", i + 1) } else { format!("'{}'", cut(entry)) };
                Err(format!("{flag}: {shown} is not key{sep}value (entries separated by commas)"))
            }
        })
        .collect()
}

impl ClientTls {
    /// The client's TLS, its files read now (at every connection: renewed
    /// certificates are taken at the next one).
    fn config(&self) -> Result<ClientTlsConfig, String> {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("--rls-xds-tls-ca", ca)?)),
            None => config.with_native_roots(),
        };
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                config = config
                    .identity(Identity::from_pem(read("--rls-xds-tls-cert", cert)?, read("--rls-xds-tls-key", key)?))
            }
            (None, None) => {}
            _ => return Err("--rls-xds-tls-cert and --rls-xds-tls-key go together".into()),
        }
        if let Some(san) = &self.san {
            config = config.domain_name(san.clone());
        }
        Ok(config)
    }
}

/// An error with its sources (tonic's errors say little alone), each
/// source once.
fn chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e)
}

fn with_sources(mut text: String, e: &dyn std::error::Error) -> String {
    let mut source = e.source();
    while let Some(s) = source {
        let shown = s.to_string();
        if !text.contains(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        source = s.source();
    }
    text
}

/// A call's status: its code, message and what caused it.
fn status(s: &tonic::Status) -> String {
    with_sources(format!("{:?}: {}", s.code(), s.message()), s)
}

impl XdsOptions {
    /// Everything that can be checked before the first connection (the
    /// URL, the headers, the TLS files): a problem refuses the start.
    pub fn check(&self) -> Result<(), String> {
        if self.connect_retry.is_zero() || self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return Err(format!(
                "--rls-xds-connect-retry-ms {}, --rls-xds-backoff-initial-ms {} and --rls-xds-backoff-max-ms {}: \
                 above 0, the maximum not below the first",
                self.connect_retry.as_millis(),
                self.backoff_initial.as_millis(),
                self.backoff_max.as_millis()
            ));
        }
        self.endpoint()?;
        self.metadata()?;
        Ok(())
    }

    fn endpoint(&self) -> Result<Endpoint, String> {
        let url = if self.url.contains("://") {
            self.url.clone()
        } else {
            format!("{}://{}", if self.tls.is_some() { "https" } else { "http" }, self.url)
        };
        let endpoint = Endpoint::from_shared(url)
            .map_err(|e| format!("--rls-xds {}: {}", self.url, chain(&e)))?
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            // A server gone without a word is found out.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        match &self.tls {
            None => Ok(endpoint),
            Some(tls) => {
                endpoint.tls_config(tls.config()?).map_err(|e| format!("--rls-xds {} TLS: {}", self.url, chain(&e)))
            }
        }
    }

    fn metadata(&self) -> Result<MetadataMap, String> {
        let mut map = MetadataMap::new();
        for (k, v) in &self.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("--rls-xds-headers: '{}' is not a header name", cut(k)))?;
            let value = AsciiMetadataValue::try_from(v.as_str())
                .map_err(|_| format!("--rls-xds-headers: the value of {k} is not a header value"))?;
            map.append(key, value);
        }
        Ok(map)
    }

    fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value { kind: Some(Kind::StringValue(v.clone())) }))
            .collect();
        Node {
            id: self.node_id.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "rl-relay".into(),
            ..Node::default()
        }
    }
}

/// What a stream's life left: the version in force, and lines of one kind
/// rate limited (a server may push versions as fast as it likes).
struct Client {
    rls: Arc<Rls>,
    options: XdsOptions,
    in_force: String,
    ended: Throttled,
    applied: Throttled,
    refused: Throttled,
}

/// Fetches the config until the process ends.
pub async fn run(rls: Arc<Rls>, options: XdsOptions) {
    let mut backoff = options.backoff_initial;
    let every = Duration::from_secs(10);
    let mut client = Client {
        rls,
        options,
        in_force: String::new(),
        ended: Throttled::new(every),
        applied: Throttled::new(every),
        refused: Throttled::new(every),
    };
    loop {
        let (mut connected, mut delivered) = (false, false);
        let why = client.stream(&mut connected, &mut delivered).await;
        client.rls.stats.xds_connected.store(0, Relaxed);
        if delivered {
            backoff = client.options.backoff_initial;
        }
        let wait = if connected {
            let wait = jittered(backoff);
            backoff = (backoff * 2).min(client.options.backoff_max);
            wait
        } else {
            jittered(client.options.connect_retry)
        };
        client.ended.log(|| {
            format!(
                "xDS: no config stream from {} ({why}); the config in force kept (version '{}'), again in {} ms",
                client.options.url,
                cut(&client.in_force),
                wait.as_millis()
            )
        });
        tokio::time::sleep(wait).await;
    }
}

/// Between half of `d` and all of it.
fn jittered(d: Duration) -> Duration {
    let r = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    d / 2 + d.mul_f64((r % 1024) as f64 / 2048.0)
}

impl Client {
    /// One stream, until it fails: why it ended. `connected` once the
    /// stream opened, `delivered` once a response came.
    async fn stream(&mut self, connected: &mut bool, delivered: &mut bool) -> String {
        let (endpoint, metadata) = match (self.options.endpoint(), self.options.metadata()) {
            (Ok(e), Ok(m)) => (e, m),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => return format!("connecting: {}", chain(&e)),
        };
        let mut ads = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.options.max_message_bytes)
            .max_encoding_message_size(self.options.max_message_bytes);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let first = DiscoveryRequest {
            version_info: self.in_force.clone(),
            node: Some(self.options.node()),
            type_url: TYPE_URL.into(),
            ..DiscoveryRequest::default()
        };
        let _ = tx.send(first).await;
        let requests = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let mut request = tonic::Request::new(requests);
        *request.metadata_mut() = metadata;
        let mut responses = match ads.stream_aggregated_resources(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => return status(&s),
        };
        *connected = true;
        self.rls.stats.xds_connected.store(1, Relaxed);
        line(format_args!("xDS: config stream open to {} as node '{}'", self.options.url, self.options.node_id));
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return "the server ended the stream".into(),
                Err(s) => return status(&s),
            };
            *delivered = true;
            let answer = self.answer(&response).await;
            if tx.send(answer).await.is_err() {
                return "the stream closed".into();
            }
        }
    }

    /// The version applied and its ACK, or refused and its NACK.
    async fn answer(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let version = &response.version_info;
        let type_url = if response.type_url.is_empty() { TYPE_URL } else { &response.type_url };
        let mut reply = DiscoveryRequest {
            type_url: type_url.to_string(),
            response_nonce: response.nonce.clone(),
            ..DiscoveryRequest::default()
        };
        match self.apply(response).await {
            Ok((resources, domains)) => {
                self.in_force = version.clone();
                self.rls.first_config_pending.store(false, Relaxed);
                self.rls.stats.xds_versions_applied.fetch_add(1, Relaxed);
                self.applied.log(|| {
                    format!(
                        "xDS: config version '{}' applied: {resources} RateLimitConfigs, {domains} domains",
                        cut(version)
                    )
                });
            }
            Err(e) => {
                self.rls.stats.xds_nacks.fetch_add(1, Relaxed);
                self.refused.log(|| {
                    format!(
                        "xDS: config version '{}' refused (NACK), the one in force kept (version '{}'): {e}",
                        cut(version),
                        cut(&self.in_force)
                    )
                });
                // google.rpc.Code INVALID_ARGUMENT.
                reply.error_detail = Some(Status { code: 3, message: e, details: Vec::new() });
            }
        }
        reply.version_info = self.in_force.clone();
        reply
    }

    /// A response read as a config and put in force (counted either way):
    /// its resources and domains, or what is wrong with it.
    async fn apply(&self, response: &DiscoveryResponse) -> Result<(usize, usize), String> {
        let loaded = match texts(response) {
            Ok(texts) => {
                let merge = self.rls.options.merge_domains;
                let reading = tokio::task::spawn_blocking(move || {
                    RlsConfig::from_texts(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())), merge)
                });
                reading.await.unwrap_or_else(|e| Err(refusal(format!("reading it failed: {e}"))))
            }
            Err(e) => Err(e),
        };
        match super::watch::apply(&self.rls, loaded) {
            Ok((_, domains)) => Ok((response.resources.len(), domains)),
            Err(ConfigError { file, problem: Some(p), .. }) if !p.path.is_empty() => {
                Err(format!("{file}: {}: {}", p.path, p.reason))
            }
            Err(ConfigError { file, reason, .. }) => Err(format!("{file}: {reason}")),
        }
    }
}

fn refusal(reason: String) -> ConfigError {
    ConfigError { file: "the DiscoveryResponse".into(), problem: None, reason }
}

/// Each resource as the YAML file it stands for, named for messages.
fn texts(response: &DiscoveryResponse) -> Result<Vec<(String, String)>, ConfigError> {
    if response.type_url != TYPE_URL {
        return Err(refusal(format!("type_url '{}' is not {TYPE_URL}, the one asked for", cut(&response.type_url))));
    }
    let mut texts = Vec::with_capacity(response.resources.len());
    let mut total = 0;
    for (i, any) in response.resources.iter().enumerate() {
        let at = |reason: String| ConfigError { file: format!("resources[{i}]"), problem: None, reason };
        if any.type_url != TYPE_URL {
            return Err(at(format!("type_url '{}' is not {TYPE_URL}", cut(&any.type_url))));
        }
        let config =
            RateLimitConfig::decode(any.value.as_slice()).map_err(|e| at(format!("not a RateLimitConfig: {e}")))?;
        let yaml = config.to_yaml();
        total += yaml.len();
        if total > MAX_TOTAL_BYTES {
            return Err(at(format!("the configs are {total} bytes as YAML up to here, above {MAX_TOTAL_BYTES}")));
        }
        texts.push((format!("resources[{i}] (RateLimitConfig '{}')", cut(&config.name)), yaml));
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_as_upstream_writes_them() {
        assert_eq!(
            pairs("f", "a=1, b=x=y,", '=', false).unwrap(),
            [("a".to_string(), "1".to_string()), ("b".to_string(), "x=y".to_string())]
        );
        assert_eq!(pairs("f", "", ':', false).unwrap(), []);
        let e = pairs("--rls-xds-node-metadata", "a=1,oops", '=', false).unwrap_err();
        assert!(e.contains("--rls-xds-node-metadata") && e.contains("'oops'"), "{e}");
        let e = pairs("--rls-xds-headers", "x:1,Bearer s3cret", ':', true).unwrap_err();
        assert!(e.contains("entry 2") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn the_jitter_stays_within_half_and_whole() {
        for _ in 0..100 {
            let d = jittered(Duration::from_millis(1000));
            assert!(d >= Duration::from_millis(500) && d <= Duration::from_millis(1000), "{d:?}");
        }
    }
}
