//! [`ClientTls`]: the rustls client side of a bridge, built once per bridge from `[bridge.tls]`.
//!
//! Same stack as the TLS listeners (`transport::tls`): rustls on the **ring** provider (gcc
//! alone builds it), TLS 1.3 and 1.2, PEM files through rustls-pki-types. The remote's
//! certificate must chain to `ca` (Mosquitto's `bridge_cafile`), or to the system's trust
//! store when `ca` is unset (rustls-native-certs: a cloud broker with a public certificate
//! needs no file). `cert` + `key` present a client certificate (mTLS; the key may be PKCS#8,
//! PKCS#1 or SEC1, as the listeners accept). `alpn` is offered as configured (AWS IoT on 443
//! wants `x-amzn-mqtt-ca`). The name sent as SNI and checked against the certificate is
//! `server_name`, else the host of the address being connected to (an IP address is checked
//! against the certificate's IP SANs).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::TransportError;
use crate::config::BridgeTlsConfig;
use crate::transport::read_certs;

/// The TLS settings of one bridge, ready for [`super::connect`]: built once at bridge start
/// (files read and checked then, so a bad file is a start-up error, not a reconnect loop), and
/// shared by every connect of that bridge.
#[derive(Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    /// `server_name` when set: sent as SNI and checked, whatever address is connected to.
    server_name: Option<ServerName<'static>>,
    insecure: bool,
}

impl ClientTls {
    /// Reads the files of `config` and builds the rustls client configuration.
    ///
    /// # Errors
    ///
    /// [`TransportError::TlsConfig`] naming the file that cannot be read or holds nothing
    /// usable (or the setting that is wrong: a key without a certificate, a `server_name` that
    /// is neither a DNS name nor an IP address, an empty system trust store).
    pub fn load(config: &BridgeTlsConfig) -> Result<Arc<ClientTls>, TransportError> {
        let fail = TransportError::TlsConfig;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_name = config
            .server_name
            .as_deref()
            .map(|name| {
                ServerName::try_from(name.to_owned()).map_err(|_| {
                    fail(format!(
                        "tls.server_name {name:?} is neither a DNS name nor an IP address"
                    ))
                })
            })
            .transpose()?;
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| fail(e.to_string()))?;
        let builder = if config.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate::new(&provider)))
        } else {
            builder.with_root_certificates(roots(config)?)
        };
        let mut client = match (&config.cert, &config.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert).map_err(fail)?;
                let private = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| fail(format!("{}: no usable private key: {e}", key.display())))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    fail(format!(
                        "{} / {}: client certificate and key cannot be used together: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => return Err(fail("tls.cert is set but tls.key is not".into())),
            (None, Some(_)) => return Err(fail("tls.key is set but tls.cert is not".into())),
        };
        client.alpn_protocols = config.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Ok(Arc::new(ClientTls {
            config: Arc::new(client),
            server_name,
            insecure: config.insecure,
        }))
    }

    /// True when the remote's certificate is not checked (`insecure`).
    pub fn is_insecure(&self) -> bool {
        self.insecure
    }

    /// The rustls configuration.
    pub(super) fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// The name to send as SNI and check: `server_name`, else `host` (a DNS name or an IP
    /// address; `None` when it is neither).
    pub(super) fn server_name(&self, host: &str) -> Option<ServerName<'static>> {
        match &self.server_name {
            Some(name) => Some(name.clone()),
            None => ServerName::try_from(host.to_owned()).ok(),
        }
    }
}

/// The trust anchors: the `ca` file's certificates, else the system's store.
fn roots(config: &BridgeTlsConfig) -> Result<RootCertStore, TransportError> {
    let mut roots = RootCertStore::empty();
    if let Some(ca) = &config.ca {
        for cert in read_certs(ca).map_err(TransportError::TlsConfig)? {
            roots.add(cert).map_err(|e| {
                TransportError::TlsConfig(format!("{}: unusable CA certificate: {e}", ca.display()))
            })?;
        }
        return Ok(roots);
    }
    let native = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        let errors: Vec<String> = native.errors.iter().map(ToString::to_string).collect();
        return Err(TransportError::TlsConfig(format!(
            "tls.ca is not set and the system trust store has no usable certificate ({})",
            if errors.is_empty() {
                "no errors reported; is ca-certificates installed?".to_owned()
            } else {
                errors.join("; ")
            }
        )));
    }
    Ok(roots)
}

/// The verifier of `insecure = true`: any certificate, any name, is accepted (the handshake
/// signatures are still checked, so the stream is encrypted to whoever holds the presented
/// key, just not known to be the remote).
///
/// Why it exists: tests against a remote with a throw-away self-signed certificate, as
/// Mosquitto's `bridge_insecure`. It removes what TLS is for (anyone on the path can pose as
/// the remote and read everything the bridge forwards), so every connect with it logs a
/// warning.
#[derive(Debug)]
struct AcceptAnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AcceptAnyCertificate {
    fn new(provider: &CryptoProvider) -> AcceptAnyCertificate {
        AcceptAnyCertificate {
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn dev(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("certs")
            .join(name)
    }

    fn error_of(config: &BridgeTlsConfig) -> String {
        match ClientTls::load(config) {
            Ok(_) => panic!("{config:?} loaded"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn loads_the_dev_files_and_keeps_the_settings() {
        let tls = ClientTls::load(&BridgeTlsConfig {
            ca: Some(dev("ca.pem")),
            cert: Some(dev("client.pem")),
            key: Some(dev("client.key")),
            alpn: vec!["mqtt".into(), "x-amzn-mqtt-ca".into()],
            ..BridgeTlsConfig::default()
        })
        .expect("loads");
        assert!(!tls.is_insecure());
        assert!(tls.config().client_auth_cert_resolver.has_certs());
        assert_eq!(
            tls.config().alpn_protocols,
            [&b"mqtt"[..], b"x-amzn-mqtt-ca"]
        );
        assert_eq!(
            tls.server_name("127.0.0.1"),
            Some(ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()))
        );
        assert_eq!(
            tls.server_name("::1").map(|n| n.to_str().into_owned()),
            Some("::1".into())
        );
        assert_eq!(
            tls.server_name("broker.example.com")
                .map(|n| n.to_str().into_owned()),
            Some("broker.example.com".into())
        );
        let named = ClientTls::load(&BridgeTlsConfig {
            ca: Some(dev("ca.pem")),
            server_name: Some("cloud.example.com".into()),
            ..BridgeTlsConfig::default()
        })
        .expect("loads");
        assert_eq!(
            named
                .server_name("10.0.0.1")
                .map(|n| n.to_str().into_owned()),
            Some("cloud.example.com".into()),
            "server_name wins over the address"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let missing = dev("no-such-ca.pem");
        let text = error_of(&BridgeTlsConfig {
            ca: Some(missing.clone()),
            ..BridgeTlsConfig::default()
        });
        assert!(text.contains(&*missing.to_string_lossy()), "{text}");
        // A key file is not a CA bundle.
        let text = error_of(&BridgeTlsConfig {
            ca: Some(dev("client.key")),
            ..BridgeTlsConfig::default()
        });
        assert!(
            text.contains("client.key") && text.contains("no PEM certificate"),
            "{text}"
        );
        // A certificate is not a key.
        let text = error_of(&BridgeTlsConfig {
            ca: Some(dev("ca.pem")),
            cert: Some(dev("client.pem")),
            key: Some(dev("ca.pem")),
            ..BridgeTlsConfig::default()
        });
        assert!(
            text.contains("ca.pem") && text.contains("private key"),
            "{text}"
        );
        let text = error_of(&BridgeTlsConfig {
            ca: Some(dev("ca.pem")),
            cert: Some(dev("client.pem")),
            ..BridgeTlsConfig::default()
        });
        assert!(text.contains("tls.key"), "{text}");
        let text = error_of(&BridgeTlsConfig {
            ca: Some(dev("ca.pem")),
            server_name: Some("not a name!".into()),
            ..BridgeTlsConfig::default()
        });
        assert!(
            text.contains("server_name") && text.contains("not a name!"),
            "{text}"
        );
    }
}
