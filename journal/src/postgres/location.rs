//! Where a journal on PostgreSQL is: a connection URL, parsed, with the schema its tables
//! are in and how its connections use TLS.

use super::tls;
use crate::error::{Error, Result};

/// How long a TCP connection to the server may be silent before the client sends it a
/// keepalive probe, unless the URL says (`keepalives_idle`): probes are answered by the
/// server's system, whatever its sessions are busy with, so a long statement is not cut.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The pause between unanswered keepalive probes (`keepalives_interval`).
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Unanswered keepalive probes after which the connection counts as broken
/// (`keepalives_retries`).
const KEEPALIVE_RETRIES: u32 = 4;

/// How long data sent on a connection may go unacknowledged by the server's system before
/// the connection counts as broken, unless the URL says (`tcp_user_timeout`): keepalives are
/// sent only on a silent connection, and a call whose request the server never received (it
/// went away without a word as the call was sent) would otherwise wait for the system's
/// retransmissions, a quarter of an hour on Linux. Acknowledging is the server's system's
/// work, not its sessions', so a long statement is not cut; on Linux it also bounds the
/// keepalives' probing to this long.
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long one attempt to open a TCP connection may take, unless the URL says
/// (`connect_timeout`): a host that does not answer at all would otherwise hold each attempt
/// for the system's two minutes of retries, past a sync's patience for the database to come
/// back.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A PostgreSQL location: the connection string and the schema the journal lives in.
#[derive(Debug, Clone)]
pub struct PgLocation {
    pub(super) config: tokio_postgres::Config,
    pub(super) schema: String,
    pub(super) display: String,
    pub(super) tls: tls::Tls,
}

impl PgLocation {
    /// Whether `location` names a PostgreSQL database (`postgres://…` or `postgresql://…`).
    #[must_use]
    pub fn is_postgres(location: &str) -> bool {
        location.starts_with("postgres://") || location.starts_with("postgresql://")
    }

    /// Parses a PostgreSQL URL. Besides libpq's parameters it takes `schema=NAME` (default
    /// `dtask`): the schema the journal's tables are in, so that several journals share a
    /// database. TLS is used as `sslmode` asks (`require`, `verify-ca`, `verify-full`), the
    /// server's certificate checked against the roots of `sslrootcert=PATH` or the Mozilla
    /// roots built in (`verify-ca`, which does not check the name, only against
    /// `sslrootcert`'s), with a client certificate from `sslcert=PATH` and `sslkey=PATH`; without
    /// `sslmode`, or with `disable`, `allow` or `prefer`, connections do not use TLS (see
    /// docs/postgres.md, "TLS").
    ///
    /// # Errors
    /// [`Error::InvalidLocation`] for a malformed URL, an unknown `sslmode`, `verify-ca`
    /// without `sslrootcert`, or a certificate or key file that cannot be read.
    pub fn parse(url: &str) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = "dtask".to_owned();
        let mut kept = Vec::new();
        let mut tls_parameters = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", name)) => decoded(name)?.clone_into(&mut schema),
                Some((name, value)) if tls::PARAMETERS.contains(&name) => {
                    tls_parameters.push((name, decoded(value)?));
                }
                _ => kept.push(pair),
            }
        }
        let tls_parameters: Vec<(&str, &str)> = tls_parameters
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        let tls = tls::Tls::from_parameters(&tls_parameters)?;
        if schema.is_empty() || schema.len() > 63 {
            return Err(Error::InvalidLocation(format!(
                "the schema name must be 1 to 63 bytes: {schema:?}"
            )));
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Error::InvalidLocation(format!("not a PostgreSQL URL: {e}")))?;
        config.ssl_mode(if tls.required {
            tokio_postgres::config::SslMode::Require
        } else {
            tokio_postgres::config::SslMode::Disable
        });
        if !kept.iter().any(|pair| pair.starts_with("keepalives")) {
            // A server that went away without a word (its host died, the network split) is
            // found out in about half a minute rather than the system's two hours: the call
            // waiting on it fails, and the next opens the connection again.
            config
                .keepalives(true)
                .keepalives_idle(KEEPALIVE_IDLE)
                .keepalives_interval(KEEPALIVE_INTERVAL)
                .keepalives_retries(KEEPALIVE_RETRIES);
        }
        let given = |name: &str| {
            kept.iter()
                .any(|pair| pair.split_once('=').map_or(*pair, |(n, _)| n) == name)
        };
        if !given("tcp_user_timeout") {
            // A call sent to a server that went away is failed in half a minute, as a call
            // waiting on a silent one is by the keepalives.
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        if !given("connect_timeout") {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            // Names the journal's connections in `pg_stat_activity`.
            let name: String = format!("dtask:{schema}").chars().take(63).collect();
            config.application_name(name);
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
        let display = format!(
            "{}:{} (database {}, schema {schema}{})",
            if hosts.is_empty() {
                "localhost".to_owned()
            } else {
                hosts.join(",")
            },
            if ports.is_empty() {
                "5432".to_owned()
            } else {
                ports.join(",")
            },
            config.get_dbname().unwrap_or("postgres"),
            if tls.required { ", TLS" } else { "" },
        );
        Ok(Self {
            config,
            schema,
            display,
            tls,
        })
    }

    /// Host, port, database and schema, without credentials (and ", TLS" when connections
    /// use it).
    #[must_use]
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The schema the journal's tables are in.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The URL of this location with schema `schema` (for tools that stage a journal
    /// beside another).
    #[must_use]
    pub fn url_with_schema(url: &str, schema: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("schema="))
            .collect();
        let pair = format!("schema={schema}");
        kept.push(&pair);
        format!("{base}?{}", kept.join("&"))
    }
}

/// A URL parameter's value, percent-decoded.
fn decoded(value: &str) -> Result<String> {
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|e| Error::InvalidLocation(format!("a parameter that is not UTF-8: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections probe a silent server after [`KEEPALIVE_IDLE`], unless the URL says
    /// otherwise.
    #[test]
    fn keepalives_are_short_unless_the_url_sets_them() {
        let ours = PgLocation::parse("postgres://me@db:5432/dtask").unwrap();
        assert!(ours.config.get_keepalives());
        assert_eq!(ours.config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert!(KEEPALIVE_IDLE < std::time::Duration::from_secs(60));
        let theirs = PgLocation::parse("postgres://me@db:5432/dtask?keepalives_idle=300").unwrap();
        assert_eq!(
            theirs.config.get_keepalives_idle(),
            std::time::Duration::from_secs(300)
        );
        let off = PgLocation::parse("postgres://me@db:5432/dtask?keepalives=0").unwrap();
        assert!(!off.config.get_keepalives());
    }

    /// Data sent to a server that went away fails the connection after [`TCP_USER_TIMEOUT`],
    /// and an attempt to connect gives up after [`CONNECT_TIMEOUT`], unless the URL sets them
    /// (`0`: the system's own, as libpq reads it).
    #[test]
    fn sends_and_connects_are_bounded_unless_the_url_sets_them() {
        let ours = PgLocation::parse("postgres://me@db:5432/dtask?schema=s").unwrap();
        assert_eq!(ours.config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(ours.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert!(TCP_USER_TIMEOUT <= std::time::Duration::from_secs(30));
        let theirs =
            PgLocation::parse("postgres://me@db:5432/dtask?tcp_user_timeout=120&connect_timeout=3")
                .unwrap();
        assert_eq!(
            theirs.config.get_tcp_user_timeout(),
            Some(&std::time::Duration::from_secs(120))
        );
        assert_eq!(
            theirs.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        let system =
            PgLocation::parse("postgres://me@db:5432/dtask?tcp_user_timeout=0&connect_timeout=0")
                .unwrap();
        assert_eq!(system.config.get_tcp_user_timeout(), None);
        assert_eq!(system.config.get_connect_timeout(), None);
    }
}
