//! TLS to the database, when the URL asks for it.
//!
//! `sslmode` takes libpq's values. `require`, `verify-ca` and `verify-full` connect over TLS
//! (with rustls) or not at all, and always check the server's certificate against the root
//! certificates of `sslrootcert=PATH` (a PEM file), or the Mozilla roots built in when it is
//! not given; `verify-full` and `require` also check that the certificate names the host
//! connected to, `verify-ca` does not — so `verify-ca` needs `sslrootcert`, as libpq's does:
//! against the public roots, a certificate any of their authorities issued for any name
//! would pass. (libpq's `require` checks nothing unless a root certificate is there; here it
//! is as strict as `verify-full`, so that no connection is open to a man in the middle.) A
//! client certificate for the server's `cert` authentication
//! is given as `sslcert=PATH` and `sslkey=PATH` (PEM). `disable`, `allow` and `prefer`, and
//! no `sslmode` at all, connect without TLS.

use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The URL parameters this module reads (the others go to `tokio-postgres`).
pub(crate) const PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// How a location's connections are secured: a connector for `tokio-postgres`, which uses
/// it only when the configuration's `ssl_mode` asks (it is `Disable` without TLS).
#[derive(Clone)]
pub(crate) struct Tls {
    connector: MakeRustlsConnect,
    /// Whether connections use TLS.
    pub required: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// What the URL's TLS parameters (`name`, `value` pairs of [`PARAMETERS`]) ask for.
    ///
    /// # Errors
    /// [`Error::InvalidLocation`] for an unknown `sslmode`, a file that cannot be read or
    /// holds no certificate (or key), a file given without an `sslmode` that uses TLS,
    /// `verify-ca` without `sslrootcert`, or `sslcert` without `sslkey` (or the other way
    /// round).
    pub(crate) fn from_parameters(parameters: &[(&str, &str)]) -> Result<Self> {
        let get = |name: &str| {
            parameters
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
        };
        let invalid = |why: String| Error::InvalidLocation(why);
        let check_name = match get("sslmode") {
            None | Some("disable" | "allow" | "prefer") => None,
            Some("require" | "verify-full") => Some(true),
            Some("verify-ca") => Some(false),
            Some(other) => {
                return Err(invalid(format!(
                    "unknown sslmode {other:?} (disable, allow, prefer, require, verify-ca or \
                     verify-full)"
                )))
            }
        };
        let files = ["sslrootcert", "sslcert", "sslkey"].map(|name| get(name).map(|v| (name, v)));
        let Some(check_name) = check_name else {
            if let Some((name, _)) = files.iter().flatten().next() {
                return Err(invalid(format!(
                    "{name} is given, but the sslmode does not use TLS (require, verify-ca or \
                     verify-full)"
                )));
            }
            return Ok(Self {
                connector: MakeRustlsConnect::new(config(RootCertStore::empty(), false, None)?),
                required: false,
            });
        };
        let [root, cert, key] = files.map(|f| f.map(|(_, path)| path));
        if !check_name && root.is_none() {
            // The public roots vouch for names, not for a server: any certificate one of
            // their authorities issued, for any name, would pass.
            return Err(invalid(
                "sslmode=verify-ca needs sslrootcert (the authority that issued the server's \
                 certificate): against the roots built in, a certificate issued for any name \
                 would pass; use verify-full to check the server's name against them"
                    .into(),
            ));
        }
        let roots = match root {
            None => webpki_roots::TLS_SERVER_ROOTS
                .iter()
                .cloned()
                .collect::<RootCertStore>(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|e| {
                        invalid(format!(
                            "sslrootcert {path}: a certificate that is not a root: {e}"
                        ))
                    })?;
                }
                roots
            }
        };
        let client = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| invalid(format!("sslkey {key}: no private key read: {e}")))?;
                Some((certificates(cert)?, key))
            }
            _ => {
                return Err(invalid(
                    "sslcert and sslkey go together: a client certificate and its key".into(),
                ))
            }
        };
        Ok(Self {
            connector: MakeRustlsConnect::new(config(roots, check_name, client)?),
            required: true,
        })
    }

    /// The connector for `tokio_postgres::Config::connect`.
    pub(crate) fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }
}

/// The certificates of the PEM file at `path` (at least one).
fn certificates(path: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
        .map_err(|e| Error::InvalidLocation(format!("{path}: no certificate read: {e}")))?;
    if certs.is_empty() {
        return Err(Error::InvalidLocation(format!(
            "{path}: no certificate in the file"
        )));
    }
    Ok(certs)
}

/// A client configuration with the roots `roots`, checking the host's name or not, with a
/// client certificate and key or not.
fn config(
    roots: RootCertStore,
    check_name: bool,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig> {
    let invalid = |e: rustls::Error| Error::InvalidLocation(format!("TLS: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(invalid)?;
    let builder = if check_name || roots.is_empty() {
        builder.with_root_certificates(roots)
    } else {
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| Error::InvalidLocation(format!("TLS: {e}")))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
    };
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((certs, key)) => builder.with_client_auth_cert(certs, key).map_err(invalid),
    }
}

/// `verify-ca`: the certificate's chain and validity are checked as `verify-full` checks
/// them, and the name it was issued for is not. The web PKI verifier checks the name last,
/// after the chain: a certificate it refuses only for its name has passed every other check.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            checked => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
