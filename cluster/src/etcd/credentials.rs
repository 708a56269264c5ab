//! Who a process is to etcd: a TLS client certificate, a user and password, or both.
//!
//! Why servers must prove themselves to etcd at all: etcd holds the cluster's
//! membership and its file catalog, and with no authentication anyone who reaches it
//! can list a fake node that answers GOOD and stores nothing, take a live node's id,
//! or rewrite a file's record (issue 47). With etcd's auth on, its RBAC decides who may
//! write what: servers write under `/rdmactor/<cluster>/`, clients at most read (see
//! docs/operations.md, "A closed control plane").
//!
//! Why client certificates first, as Kubernetes' API server does with etcd: with
//! `--client-cert-auth`, etcd takes the certificate's common name as the user, so the
//! proof is made by TLS on every connection and no token has to be fetched or kept
//! fresh. A user and password ask etcd for a token when connecting (etcd-client does
//! that eagerly) and again when it expires.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A TLS set-up for `https://` endpoints.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA certificates (PEM) that etcd's own certificate must chain to.
    ca_pem: Vec<u8>,
    /// This process's certificate and private key (PEM), when etcd asks for client
    /// certificates.
    identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to check etcd's certificate against, when it is not the endpoint's host.
    domain: Option<String>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// Trusts the CA certificates in the PEM file `ca`, with no client certificate.
    ///
    /// # Errors
    ///
    /// [`Error::Credentials`] when the file cannot be read.
    pub fn from_ca(ca: &Path) -> Result<EtcdTls> {
        Ok(EtcdTls {
            ca_pem: read(ca)?,
            identity: None,
            domain: None,
        })
    }

    /// Adds this process's certificate and key (PEM files): etcd with
    /// `--client-cert-auth` checks it, and with auth on takes its common name as the
    /// user.
    ///
    /// # Errors
    ///
    /// [`Error::Credentials`] when a file cannot be read.
    pub fn with_client_cert(mut self, cert: &Path, key: &Path) -> Result<EtcdTls> {
        self.identity = Some((read(cert)?, read(key)?));
        Ok(self)
    }

    /// Checks etcd's certificate against `name` instead of the endpoint's host.
    pub fn with_domain(mut self, name: impl Into<String>) -> EtcdTls {
        self.domain = Some(name.into());
        self
    }

    pub(crate) fn options(&self) -> etcd_client::TlsOptions {
        let mut tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        tls
    }
}

/// An etcd user and its password.
#[derive(Clone)]
pub struct EtcdUser {
    pub(crate) name: String,
    pub(crate) password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password stays out of logs and panics.
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EtcdUser {
    /// `name` with `password`.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> EtcdUser {
        EtcdUser {
            name: name.into(),
            password: password.into(),
        }
    }

    /// `name` with the password in the file `path` (its first line), so that the
    /// password is in neither the command line nor the environment.
    ///
    /// # Errors
    ///
    /// [`Error::Credentials`] when the file cannot be read or is not UTF-8.
    pub fn with_password_file(name: impl Into<String>, path: &Path) -> Result<EtcdUser> {
        let text = String::from_utf8(read(path)?).map_err(|e| Error::Credentials {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        Ok(EtcdUser::new(name, text.lines().next().unwrap_or_default()))
    }

    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Credentials {
        path: PathBuf::from(path),
        why: e.to_string(),
    })
}
