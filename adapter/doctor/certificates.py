"""Serving certificate checks: the name the aggregator verifies, validity, and whether the caBundle signed it."""

from __future__ import annotations

import base64
import binascii
import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from adapter.doctor.findings import Finding

# Renewal normally happens long before this; closer than this to expiry is worth a warning.
EXPIRY_WARNING = datetime.timedelta(days=14)
CHECK_SANS = "serving certificate names"
CHECK_VALIDITY = "serving certificate validity"
CHECK_CA_BUNDLE = "caBundle"


def load_pem_chain(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        return []


def check_names(cert: x509.Certificate, service: str, namespace: str) -> Finding:
    wanted = f"{service}.{namespace}.svc"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        sans = []
    if wanted in sans:
        return Finding("ok", CHECK_SANS, f"the serving certificate names {wanted}")
    shown = ", ".join(sans) if sans else "no DNS names at all"
    return Finding(
        "fail",
        CHECK_SANS,
        f"the serving certificate does not name {wanted} (it has {shown}); the aggregator verifies exactly that name, "
        "so discovery fails with an x509 error (FailedDiscoveryCheck)",
        f"re-issue it with {wanted} among its DNS names (zeroscale certs --service {service} --namespace {namespace})",
    )


def check_validity(cert: x509.Certificate, now: datetime.datetime) -> Finding:
    if now < cert.not_valid_before_utc:
        return Finding(
            "fail",
            CHECK_VALIDITY,
            f"the serving certificate is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC",
            "check the clocks of the nodes and of whatever issued it",
        )
    if now >= cert.not_valid_after_utc:
        return Finding(
            "fail",
            CHECK_VALIDITY,
            f"the serving certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
            "renew it (cert-manager renews by itself; with `zeroscale certs`, run it again and re-apply)",
        )
    left = cert.not_valid_after_utc - now
    if left < EXPIRY_WARNING:
        return Finding(
            "warn", CHECK_VALIDITY, f"the serving certificate expires in {left.days} day(s)", "renew it soon"
        )
    return Finding("ok", CHECK_VALIDITY, f"valid until {cert.not_valid_after_utc:%Y-%m-%d} ({left.days} days left)")


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    if cert == ca:
        return True
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def check_ca_bundle(cert: x509.Certificate, ca_bundle_b64: str) -> Finding:
    """Does the APIService's caBundle hold the CA that signed the serving certificate?"""
    try:
        bundle = load_pem_chain(base64.b64decode(ca_bundle_b64, validate=True))
    except (binascii.Error, ValueError):
        bundle = []
    if not bundle:
        return Finding(
            "fail",
            CHECK_CA_BUNDLE,
            "the APIService's caBundle is not base64 of PEM certificates",
            "set it to base64 of the CA certificate (the certs overlay or cert-manager's CA injector does this)",
        )
    if any(_issued_by(cert, ca) for ca in bundle):
        return Finding(
            "ok", CHECK_CA_BUNDLE, "the APIService's caBundle holds the CA that signed the serving certificate"
        )
    subjects = "; ".join(ca.subject.rfc4514_string() for ca in bundle)
    return Finding(
        "fail",
        CHECK_CA_BUNDLE,
        f"the APIService's caBundle ({subjects}) did not sign the serving certificate "
        f"(issued by {cert.issuer.rfc4514_string()}): the aggregator rejects it as signed by an unknown authority",
        "put the issuing CA in the caBundle: with cert-manager check the cert-manager.io/inject-ca-from annotation "
        "and that cainjector runs; with `zeroscale certs` re-apply the overlay with the same generated/ files",
    )
