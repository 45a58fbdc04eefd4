//! TLS: the CA file of `--tls-ca-cert`, and what to do when the server's certificate is refused.

use std::path::Path;

use distlock::LockError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// The PEM bytes of `path`, once they are known to hold at least one certificate that rustls
/// takes as a trust anchor. redis-rs reads the same bytes the same way, but a file without any
/// certificate would pass there as an empty trust store and show up only as a refused
/// handshake, blaming the server for a wrong file.
pub(crate) fn read_ca(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let what = "give the PEM file of the certificate authority that signed the server's \
                certificate (it starts with -----BEGIN CERTIFICATE-----)";
    let pem = std::fs::read(path)
        .map_err(|error| format!("cannot read the --tls-ca-cert file {shown}: {error}; {what}"))?;
    let mut anchors = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate = certificate.map_err(|error| {
            format!("the --tls-ca-cert file {shown} is not valid PEM ({error}); {what}")
        })?;
        anchors.add(certificate).map_err(|error| {
            format!(
                "the --tls-ca-cert file {shown} holds a certificate that cannot be a trust \
                 anchor ({error}); {what}"
            )
        })?;
    }
    if anchors.is_empty() {
        let hint = if pem.starts_with(&[0x30]) {
            " (this looks like a DER file: convert it with \
             `openssl x509 -inform der -in FILE -out ca.pem`)"
        } else {
            ""
        };
        return Err(format!(
            "the --tls-ca-cert file {shown} holds no PEM certificate{hint}; {what}"
        ));
    }
    Ok(pem)
}

/// The message for a server certificate that rustls refused, or `None` for any other error.
/// The library's own advice names its builder method, which means nothing at a shell.
pub(crate) fn refused_certificate(
    error: &LockError,
    at: &str,
    ca: Option<&Path>,
) -> Option<String> {
    let LockError::Redis(redis) = error else {
        return None;
    };
    let detail = redis.to_string();
    if !detail.contains("invalid peer certificate") {
        return None;
    }
    let advice = if detail.contains("NotValidForName") || detail.contains("not valid for name") {
        "the URL's host is not a name the certificate was issued for: connect by one of the \
         names it lists"
            .to_owned()
    } else {
        match ca {
            None => "if a private CA signed it, or it signs itself, trust that CA: give its \
                     PEM file with --tls-ca-cert PATH or DISTLOCK_TLS_CA_CERT"
                .to_owned(),
            Some(path) => format!(
                "the CA in --tls-ca-cert {} did not sign it: give the CA that did",
                path.display()
            ),
        }
    };
    Some(format!(
        "cannot use Redis at {at}: its TLS certificate was not accepted ({detail})\n({advice})"
    ))
}
