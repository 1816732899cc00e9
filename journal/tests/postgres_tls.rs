//! The PostgreSQL journal over TLS: a private cluster (see `cluster`) serving TLS with
//! certificates made by the test, and journals opened with each `sslmode`: the server's
//! certificate checked as the mode says, every connection of the journal encrypted (as the
//! server's `pg_stat_ssl` shows), and a client certificate for the server's `cert`
//! authentication. Without `DTASK_TEST_PG_BIN` the tests say loudly that they were skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod strategies;

use cluster::Cluster;
use dtask_journal::{Error, Journal, JournalOptions};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use strategies::created;

/// A certificate authority of the test's own.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A certificate for `names` (host names or addresses), with common name `common`,
    /// signed by this authority: the certificate's and its key's PEM.
    fn issue(&self, common: &str, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, common);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A cluster serving TLS with a certificate for `localhost` alone (not for `127.0.0.1`),
/// issued by `authority`; connections without TLS are let in too. Returns the cluster and
/// the path of the authority's certificate.
fn tls_cluster(test: &str, authority: &Authority, access_rules: &str) -> Option<(Cluster, String)> {
    let cluster = Cluster::init(test, "")?;
    let (cert, key) = authority.issue("localhost", &["localhost"]);
    let cert = cluster.give("server.crt", &cert);
    let key = cluster.give("server.key", &key);
    let ca = cluster.give("ca.crt", &authority.cert.pem());
    cluster.set_access_rules(access_rules);
    std::fs::write(
        std::path::Path::new(&cluster.data()).join("postgresql.auto.conf"),
        format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nssl_ca_file = '{}'\n",
            cert.display(),
            key.display(),
            ca.display()
        ),
    )
    .unwrap();
    cluster.start();
    let ca = ca.display().to_string();
    Some((cluster, ca))
}

/// The URL of a journal in `schema` on `host`, as `user`, with `parameters`.
fn url(cluster: &Cluster, user: &str, host: &str, schema: &str, parameters: &str) -> String {
    format!(
        "postgres://{user}@{host}:{}/postgres?schema={schema}&{parameters}",
        cluster.port
    )
}

/// A connection of the server's superuser, without TLS, and the runtime that drives it.
fn admin(cluster: &Cluster) -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!(
        "postgres://{}@127.0.0.1:{}/postgres",
        cluster.user(),
        cluster.port
    );
    let client = runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    });
    (runtime, client)
}

/// How many connections of the journal in `schema` (its application name) use TLS, and how
/// many do not, as the server sees them.
fn connections(cluster: &Cluster, schema: &str) -> (i64, i64) {
    let (runtime, client) = admin(cluster);
    let row = runtime
        .block_on(client.query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
            &[&format!("dtask:{schema}")],
        ))
        .unwrap();
    (row.get(0), row.get(1))
}

/// Opens a journal at `url`, appends to it and reads it back.
fn use_journal(url: &str) -> Journal {
    let journal = Journal::open_postgres(url, JournalOptions::default()).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    let reader = Journal::open_postgres_read_only(url).unwrap();
    assert_eq!(reader.read_stream("t", 0).count(), 1);
    journal
}

/// The error of opening a journal at `url`, which must fail.
fn refused(url: &str) -> String {
    match Journal::open_postgres(url, JournalOptions::default()) {
        Ok(_) => panic!("{url}: opened"),
        Err(e) => {
            eprintln!("refused, as it must be: {e}");
            e.to_string()
        }
    }
}

const TRUST: &str =
    "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n";

/// Each `sslmode` checks what it says: `verify-full` and `require` the chain and the host's
/// name, `verify-ca` the chain alone; the Mozilla roots built in do not trust a private
/// authority, and a certificate of another authority is refused. Every connection of a
/// journal opened with TLS is encrypted; one opened without `sslmode` is not.
#[test]
fn each_sslmode_checks_the_servers_certificate_as_it_says_and_encrypts_every_connection() {
    let authority = Authority::new("dtask test authority");
    let Some((cluster, ca)) = tls_cluster("tlsmodes", &authority, TRUST) else {
        return;
    };
    let user = cluster.user().to_owned();

    // The certificate names `localhost`: verified whole.
    let full = url(
        &cluster,
        &user,
        "localhost",
        "full",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let journal = use_journal(&full);
    assert!(
        journal.location().ends_with(", TLS)"),
        "{}",
        journal.location()
    );
    let (encrypted, plain) = connections(&cluster, "full");
    assert!(
        encrypted >= 6,
        "the readers, the writer and the syncer: {encrypted}"
    );
    assert_eq!(plain, 0);
    drop(journal);

    // Reached as `127.0.0.1`, which it does not name: `require` and `verify-full` refuse it,
    // `verify-ca` takes it.
    for mode in ["require", "verify-full"] {
        let why = refused(&url(
            &cluster,
            &user,
            "127.0.0.1",
            "name",
            &format!("sslmode={mode}&sslrootcert={ca}"),
        ));
        assert!(why.contains("not valid for name"), "{mode}: {why}");
    }
    let journal = use_journal(&url(
        &cluster,
        &user,
        "127.0.0.1",
        "ca",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ));
    assert_eq!(connections(&cluster, "ca").1, 0);
    drop(journal);

    // Another authority's certificate, or the Mozilla roots: not trusted, whatever the mode.
    let other = Authority::new("another authority");
    let other = cluster.give("other.crt", &other.cert.pem());
    let why = refused(&url(
        &cluster,
        &user,
        "localhost",
        "other",
        &format!("sslmode=verify-ca&sslrootcert={}", other.display()),
    ));
    assert!(why.contains("UnknownIssuer"), "{why}");
    let why = refused(&url(
        &cluster,
        &user,
        "localhost",
        "mozilla",
        "sslmode=verify-full",
    ));
    assert!(why.contains("UnknownIssuer"), "{why}");

    // No sslmode: no TLS, as before.
    let journal = use_journal(&url(&cluster, &user, "127.0.0.1", "plain", ""));
    let (encrypted, plain) = connections(&cluster, "plain");
    assert_eq!(encrypted, 0);
    assert!(plain >= 6, "{plain}");
    drop(journal);
}

/// A server that lets a user in only with a client certificate (`cert` authentication, the
/// certificate's common name the user's name) takes the journal's `sslcert` and `sslkey`,
/// and refuses the journal without them.
#[test]
fn a_client_certificate_lets_the_journal_in_where_the_server_asks_for_one() {
    let authority = Authority::new("dtask test authority");
    let rules = format!("local all all trust\nhostssl all certified 127.0.0.1/32 cert\n{TRUST}");
    let Some((cluster, ca)) = tls_cluster("tlscert", &authority, &rules) else {
        return;
    };
    // The user, allowed to make the journal's schema.
    let (runtime, client) = admin(&cluster);
    runtime
        .block_on(client.batch_execute(
            "CREATE ROLE certified LOGIN; GRANT CREATE ON DATABASE postgres TO certified",
        ))
        .unwrap();
    let (cert, key) = authority.issue("certified", &[]);
    let cert = cluster.give("client.crt", &cert);
    let key = cluster.give("client.key", &key);
    let tls = format!("sslmode=verify-ca&sslrootcert={ca}");
    let why = refused(&url(&cluster, "certified", "127.0.0.1", "certified", &tls));
    assert!(why.contains("certificate"), "{why}");
    let with_cert = format!("{tls}&sslcert={}&sslkey={}", cert.display(), key.display());
    let journal = use_journal(&url(
        &cluster,
        "certified",
        "127.0.0.1",
        "certified",
        &with_cert,
    ));
    let (encrypted, plain) = connections(&cluster, "certified");
    assert!(encrypted >= 6, "{encrypted}");
    assert_eq!(plain, 0);
    drop(journal);
}

/// TLS parameters that cannot work are refused at parse, before any connection: an unknown
/// `sslmode`, a certificate file that is missing or holds none, a file given without an
/// `sslmode` that uses TLS, a client certificate without its key, and `verify-ca` without
/// `sslrootcert` (the public roots with no check of the name would take any certificate
/// they vouch for).
#[test]
fn tls_parameters_that_cannot_work_are_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let base = "postgres://nobody@127.0.0.1:1/postgres?";
    for (parameters, expected) in [
        ("sslmode=sometimes".to_owned(), "unknown sslmode"),
        ("sslmode=verify-ca".to_owned(), "needs sslrootcert"),
        (
            format!("sslmode=verify-full&sslrootcert={}", missing.display()),
            "missing.pem",
        ),
        (
            format!("sslmode=verify-full&sslrootcert={}", empty.display()),
            "no certificate",
        ),
        (
            format!("sslrootcert={}", empty.display()),
            "does not use TLS",
        ),
        (
            format!("sslmode=prefer&sslcert={}", empty.display()),
            "does not use TLS",
        ),
        (
            format!("sslmode=require&sslcert={}", empty.display()),
            "go together",
        ),
    ] {
        match Journal::open_postgres(&format!("{base}{parameters}"), JournalOptions::default()) {
            Err(Error::InvalidLocation(why)) => {
                assert!(why.contains(expected), "{parameters}: {why}");
            }
            other => panic!("{parameters}: {other:?}"),
        }
    }
}
