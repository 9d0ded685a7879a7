"""实名认证: check characters (GB 11643, GB 32100), personal verification by the sandbox provider,
organisations through the operators' review queue, what is kept of a person, the licence file."""

from __future__ import annotations

from datetime import date

import pytest
from django.core import mail
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.test import APIClient

from console.verification import checks, services
from console.verification.models import Verification
from console.verification.providers import SANDBOX_REJECTED_NAME
from tests.console.factories import UserFactory

API = "/api/v1/verification/"
PAGE = "/account/verification/"
ID_NUMBER = "11010519491231002X"  # GB 11643's own example
CREDIT_CODE = "91350100M000100Y43"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200


@pytest.fixture(autouse=True)
def _private_dir(settings, tmp_path):
    settings.PRIVATE_FILES_DIR = tmp_path / "private"


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _licence(content: bytes = PNG, name: str = "licence.png") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="image/png")


# --- check characters ----------------------------------------------------------------------------
def test_known_numbers() -> None:
    assert checks.resident_id_valid(ID_NUMBER)
    assert checks.resident_id_valid(ID_NUMBER.lower())  # people type x
    assert not checks.resident_id_valid("110105194912310021")
    assert not checks.resident_id_valid("11010519491331002X")  # month 13
    assert not checks.resident_id_valid("1101051949123100")  # short
    assert checks.credit_code_valid(CREDIT_CODE)
    assert not checks.credit_code_valid("91350100M000100Y44")
    assert not checks.credit_code_valid("91350100M000100I43")  # I is not in the alphabet
    assert checks.mask_id_number(ID_NUMBER) == "11**************2X"


@given(
    region=st.integers(110000, 659999),
    born=st.dates(date(1900, 1, 1), date(2020, 12, 31)),
    seq=st.integers(0, 999),
    pos=st.integers(0, 16),
    delta=st.integers(1, 9),
)
def test_a_resident_id_check_catches_any_one_wrong_digit(region, born, seq, pos, delta) -> None:
    first17 = f"{region:06d}{born:%Y%m%d}{seq:03d}"
    number = first17 + checks.resident_id_check_char(first17)
    assert checks.resident_id_valid(number)
    wrong = list(number)
    wrong[pos] = str((int(wrong[pos]) + delta) % 10)
    typo = "".join(wrong)
    # A typo that still reads as a date is refused by its check character; others by the date.
    assert not checks.resident_id_valid(typo)


@given(
    first17=st.text(alphabet=checks.CREDIT_CODE_ALPHABET, min_size=17, max_size=17),
    pos=st.integers(0, 17),
    delta=st.integers(1, 30),
)
def test_a_credit_code_check_catches_any_one_wrong_character(first17, pos, delta) -> None:
    code = first17 + checks.credit_code_check_char(first17)
    assert checks.credit_code_valid(code)
    alphabet = checks.CREDIT_CODE_ALPHABET
    wrong = list(code)
    wrong[pos] = alphabet[(alphabet.index(wrong[pos]) + delta) % 31]
    assert not checks.credit_code_valid("".join(wrong))


# --- a person, through the sandbox ---------------------------------------------------------------
@pytest.mark.django_db
def test_personal_verification_by_api_keeps_only_the_masked_number(
    django_capture_on_commit_callbacks, caplog
) -> None:
    user = UserFactory(verified=False)
    api = _api(user)
    assert api.get(API).json()["state"] == "none"
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(API, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "approved" and body["kind"] == "personal"
    assert body["id_number_masked"] == "11**************2X"
    assert body["provider"] == "sandbox"
    assert ID_NUMBER not in r.content.decode() and ID_NUMBER not in api.get(API).content.decode()
    row = Verification.objects.get(owner=user)
    stored = " ".join(str(getattr(row, f.attname)) for f in Verification._meta.concrete_fields)
    assert ID_NUMBER not in stored and ID_NUMBER[:17] not in stored
    assert row.id_number_hash == services.id_number_hash(ID_NUMBER.lower())
    assert ID_NUMBER not in caplog.text
    assert services.verified(user) == row
    # The decision is notified (console/notices/): inbox and mail, in the account's language.
    assert len(mail.outbox) == 1
    assert "实名认证已通过" in mail.outbox[0].subject and "张三" in mail.outbox[0].body
    assert user.notices.get().event == "verification_approved"


@pytest.mark.django_db
def test_a_wrong_check_character_is_a_field_error() -> None:
    user = UserFactory(verified=False)
    r = _api(user).post(
        API, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER[:-1] + "1"}
    )
    assert r.status_code == 400
    assert r.json()["error"] == "invalid" and "id_number" in r.json()["fields"]
    assert not Verification.objects.exists()


@pytest.mark.django_db
def test_the_sandbox_can_refuse_and_the_person_tries_again() -> None:
    user = UserFactory(verified=False)
    api = _api(user)
    r = api.post(
        API, {"kind": "personal", "real_name": SANDBOX_REJECTED_NAME, "id_number": ID_NUMBER}
    )
    assert r.status_code == 201 and r.json()["state"] == "rejected" and r.json()["reason"]
    assert services.verified(user) is None
    r = api.post(API, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER})
    assert r.json()["state"] == "approved"
    again = api.post(API, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER})
    assert again.status_code == 409 and again.json()["error"] == "conflict"


@pytest.mark.django_db
def test_the_page_verifies_a_person_in_both_languages(client) -> None:
    user = UserFactory(verified=False)
    client.force_login(user)
    page = client.get(PAGE, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "实名认证" in page and 'id="sandbox-provider"' in page and "沙箱" in page
    page_en = client.get(PAGE, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Real-name verification" in page_en and "Sandbox" in page_en
    bad = client.post(PAGE, {"kind": "personal", "real_name": "张三", "id_number": "123"})
    assert bad.status_code == 400
    r = client.post(PAGE, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER})
    assert r.status_code == 302
    assert 'data-state="approved"' in client.get(PAGE).content.decode()


# --- an organisation, through the review queue -------------------------------------------------
@pytest.mark.django_db
def test_an_organisation_is_reviewed_by_an_operator(
    client, operator_client, django_capture_on_commit_callbacks
) -> None:
    user = UserFactory(verified=False)
    r = _api(user).post(
        API,
        {
            "kind": "enterprise",
            "organisation_name": "北京某某科技有限公司",
            "credit_code": CREDIT_CODE.lower(),
            "licence": _licence(),
            "contact_name": "李四",
            "contact_phone": "+86 10 1234 5678",
        },
        format="multipart",
    )
    assert r.status_code == 201, r.content
    assert r.json()["state"] == "pending" and r.json()["credit_code"] == CREDIT_CODE
    row = Verification.objects.get(owner=user)
    queue = operator_client.get("/ops/verifications/").content.decode()
    assert "北京某某科技有限公司" in queue
    # The licence: the operator and the owner read it; nobody else.
    licence_url = f"/account/verification/{row.public_id}/licence/"
    assert b"".join(operator_client.get(licence_url).streaming_content) == PNG
    client.force_login(UserFactory())
    assert client.get(licence_url).status_code == 404
    client.force_login(user)
    assert client.get(licence_url).status_code == 200
    assert client.get("/ops/verifications/").status_code == 403
    # A rejection needs a reason.
    url = f"/ops/verifications/{row.public_id}/decide/"
    operator_client.post(url, {"decision": "reject", "reason": ""})
    row.refresh_from_db()
    assert row.state == "pending"
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post(url, {"decision": "approve"})
    row.refresh_from_db()
    assert row.state == "approved" and row.reviewed_by is not None
    assert services.verified(user).is_organisation
    assert len(mail.outbox) == 1 and user.email in mail.outbox[0].to
    # Decided once.
    with pytest.raises(services.VerificationError):
        services.decide(row.public_id, approve=False, by=None, reason="late")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "error"),
    [(b"just some text", "PNG"), (b"%PDF-" + b"x" * (2 * 1024 * 1024), "MB")],
)
def test_a_licence_is_type_and_size_checked(settings, content, error) -> None:
    settings.VERIFICATION_LICENCE_MAX_BYTES = 1024 * 1024
    user = UserFactory(verified=False)
    with pytest.raises(services.VerificationError) as refused:
        services.submit_organisation(
            user,
            kind="university",
            organisation_name="某某大学",
            credit_code=CREDIT_CODE,
            licence=_licence(content, "x.pdf"),
            contact_name="王五",
            contact_phone="010-12345678",
        )
    assert refused.value.field == "licence" and error in refused.value.message()
    assert not Verification.objects.exists()


@pytest.mark.django_db
def test_an_invalid_credit_code_is_refused() -> None:
    user = UserFactory(verified=False)
    with pytest.raises(services.VerificationError) as refused:
        services.submit_organisation(
            user,
            kind="enterprise",
            organisation_name="某公司",
            credit_code="91350100M000100Y44",
            licence=_licence(),
            contact_name="王五",
            contact_phone="010-12345678",
        )
    assert refused.value.field == "credit_code"


# --- the gate itself -----------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_gate_follows_its_setting(settings) -> None:
    user = UserFactory(verified=False)
    assert settings.VERIFICATION_REQUIRED_FOR == ["topup", "invoice", "large_order"]
    with pytest.raises(services.VerificationRequired) as refused:
        services.require_verified(user, "invoice")
    assert refused.value.http_status == 403
    assert refused.value.as_body()["error"] == "verification_required"
    services.require_verified_for_order(user, 8)  # small hosts: never gated
    with pytest.raises(services.VerificationRequired):
        services.require_verified_for_order(user, 64)
    settings.VERIFICATION_REQUIRED_FOR = ["invoice"]
    services.require_verified_for_order(user, 128)
    settings.VERIFICATION_REQUIRED_FOR = []
    services.require_verified(user, "invoice")


@pytest.mark.django_db
def test_the_demo_customer_is_verified_by_the_sandbox_once() -> None:
    """The demo needs no verification step: demo_setup verifies its customer (idempotent)."""
    from console.management.commands.demo_setup import Command
    from console.models import User

    for _ in range(2):
        Command()._ensure_user("demo", "demo@example.com", "demo-password-2026", False)
        Command()._ensure_user("ops", "ops@example.com", "ops-password-2026", True)
    demo = User.objects.get(username="demo")
    assert services.verified(demo).provider == "sandbox"
    assert Verification.objects.filter(owner=demo).count() == 1
    assert services.verified(User.objects.get(username="ops")) is None


@pytest.mark.django_db
def test_one_id_number_verifies_one_account() -> None:
    first, second = UserFactory(verified=False), UserFactory(verified=False)
    assert (
        services.submit_personal(first, real_name="张三", id_number=ID_NUMBER).state == "approved"
    )
    r = _api(second).post(API, {"kind": "personal", "real_name": "张三", "id_number": ID_NUMBER})
    assert r.status_code == 409 and "id_number" in r.json()["fields"]
    assert services.verified(second) is None
