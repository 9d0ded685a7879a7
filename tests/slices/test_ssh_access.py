"""SSH through the region's gateway without a network (issue 19): the fleet file's ``gateway:``
block, the per-instance port, the keys file the console computes, and what the page and the
API show (the simulated fleet). The real thing, on sshd test hosts: test_ssh_gateway.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse
from rest_framework.test import APIClient

from billing import services as billing
from console import services as console_services
from slices import services
from slices.choices import InstanceState
from slices.drivers.base import DriverError, GatewayGrant
from slices.drivers.gateway import keys_file
from slices.fleetfile import FleetFileError, parse_fleet
from slices.models import Gateway, InstanceNode, Node
from slices.services import access, load_fleet
from tests.console.factories import ed25519_public_key
from tests.slices.factories import SMALL_FLEET, run_order

GATEWAY = """\
    gateway:
      host: gw-xiamen.gpu-console.example
      port: 2222
      user: gpc
      address: 10.10.0.2
      host_key: "SHA256:{fp}"
"""
FP = "A" * 43


def _fleet_text(block: str = GATEWAY) -> str:
    return SMALL_FLEET.replace(
        "    name_zh: 厦门\n", "    name_zh: 厦门\n" + block.format(fp=FP), 1
    )


# -- the fleet file ------------------------------------------------------------------------------
def test_the_gateway_block_is_read_with_its_defaults() -> None:
    spec = parse_fleet(_fleet_text())
    gw = {r.code: r.gateway for r in spec.regions}
    assert gw["yinchuan"] is None
    assert gw["xiamen"] is not None
    assert (gw["xiamen"].host, gw["xiamen"].port, gw["xiamen"].user) == (
        "gw-xiamen.gpu-console.example",
        2222,
        "gpc",
    )
    assert (gw["xiamen"].ssh_port, gw["xiamen"].keys_file) == (
        22,
        "/etc/gpc-gateway/authorized_keys",
    )
    assert gw["xiamen"].host_key == f"SHA256:{FP}"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("      host: gw.example; rm -rf /\n", "gateway host"),
        ("      host: GW.Example.com\n", "gateway host"),
        ("      address: 10.0.0.1 -oProxyCommand=x\n", "gateway address"),
        ("      user: Root$\n", "gateway user"),
        ("      port: 70000\n", "out of range"),
        ("      keys_file: etc/keys\n", "an absolute path"),
        ("      keys_file: /etc/../root/.ssh/authorized_keys\n", "an absolute path"),
        ("      host_key: not-a-key\n", "host key"),
        ("      shell: /bin/sh\n", "unknown key 'shell' in a gateway"),
    ],
)
def test_a_bad_gateway_block_is_refused_with_its_line(line: str, reason: str) -> None:
    key = line.split(":", 1)[0].strip()
    base = [ln for ln in GATEWAY.splitlines(keepends=True) if ln.split(":", 1)[0].strip() != key]
    text = _fleet_text("".join(base) + line)
    with pytest.raises(FleetFileError) as excinfo:
        parse_fleet(text)
    assert reason in excinfo.value.reason
    bad_line = text.splitlines().index(line.rstrip("\n").replace("{fp}", FP)) + 1
    assert excinfo.value.line == bad_line


def test_a_gateway_needs_a_host_and_an_address() -> None:
    with pytest.raises(FleetFileError, match="missing key 'address'"):
        parse_fleet(_fleet_text("    gateway:\n      host: gw.example.com\n"))


@pytest.mark.django_db
def test_loading_makes_one_gateway_per_region_and_changes_nothing_the_second_time() -> None:
    report = load_fleet(parse_fleet(_fleet_text()))
    assert report.created.get("gateways") == 1
    gw = Gateway.objects.get(region__code="xiamen")
    assert (gw.host, gw.port, gw.address, gw.in_fleet_file) == (
        "gw-xiamen.gpu-console.example",
        2222,
        "10.10.0.2",
        True,
    )
    again = load_fleet(parse_fleet(_fleet_text()))
    assert not again.created.get("gateways") and not again.updated.get("gateways")
    # The block left the file: the row stays (its keys are still out there), flagged.
    load_fleet(parse_fleet(SMALL_FLEET))
    assert Gateway.objects.get(pk=gw.pk).in_fleet_file is False


def test_the_shipped_fleet_has_a_gateway_per_region() -> None:
    from slices.fleetfile import SHIPPED_FLEET, load_fleet_file

    spec = load_fleet_file(SHIPPED_FLEET)
    assert all(r.gateway is not None for r in spec.regions)
    assert {r.gateway.host for r in spec.regions if r.gateway} == {
        f"gw-{r.code}.gpu-console.example" for r in spec.regions
    }


# -- the keys file -------------------------------------------------------------------------------
KEY_A = ed25519_public_key("a@x")
KEY_B = ed25519_public_key("b@x")


def _canon(line: str) -> str:
    return " ".join(line.split()[:2])


def test_each_key_gets_one_line_that_forwards_to_its_endpoints_only() -> None:
    text, count = keys_file(
        [
            GatewayGrant(_canon(KEY_A), (("10.11.1.1", 30001), ("10.11.1.2", 30002)), "owner-a"),
            GatewayGrant(_canon(KEY_B), (("10.11.1.1", 30003),), "owner-b"),
        ]
    )
    assert count == 2
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    a = next(ln for ln in lines if _canon(KEY_A) in ln)
    assert a == (
        'restrict,port-forwarding,permitopen="10.11.1.1:30001",permitopen="10.11.1.2:30002",'
        f'command="/bin/false" {_canon(KEY_A)} gpc:owner-a'
    )
    assert "30001" not in next(ln for ln in lines if _canon(KEY_B) in ln)


def test_a_key_of_two_owners_and_the_console_key_are_never_written() -> None:
    text, count = keys_file(
        [
            GatewayGrant(_canon(KEY_A), (("10.11.1.1", 30001),), "owner-a"),
            GatewayGrant(_canon(KEY_A), (("10.11.1.2", 30002),), "owner-b"),
            GatewayGrant(_canon(KEY_B), (("10.11.1.1", 30003),), "owner-b"),
        ],
        exclude=[KEY_B],
    )
    assert count == 0
    assert _canon(KEY_A).split()[1] not in text and _canon(KEY_B).split()[1] not in text


@pytest.mark.parametrize(
    "grant",
    [
        GatewayGrant(KEY_A, (("10.0.0.1", 30000),)),  # with its comment: not rebuilt
        GatewayGrant('command="sh" ' + _canon(KEY_A), (("10.0.0.1", 30000),)),
        GatewayGrant(_canon(KEY_A) + "\nssh-ed25519 AAAAC3Nz", (("10.0.0.1", 30000),)),
        GatewayGrant(_canon(KEY_A), (('10.0.0.1",command="sh', 30000),)),
        GatewayGrant(_canon(KEY_A), (("10.0.0.1", 0),)),
        GatewayGrant(_canon(KEY_A), ()),
        GatewayGrant(_canon(KEY_A), (("10.0.0.1", 30000),), 'x" y'),
    ],
)
def test_anything_but_a_plain_key_address_and_port_is_refused(grant: GatewayGrant) -> None:
    with pytest.raises(DriverError) as excinfo:
        keys_file([grant])
    assert excinfo.value.permanent


# -- ports ---------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_two_instances_never_share_a_port_on_a_node_and_a_full_range_gives_none(
    sim_driver, settings, alice, django_capture_on_commit_callbacks
) -> None:
    load_fleet(parse_fleet(_fleet_text()))
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    settings.SLICES_INSTANCE_SSH_PORTS = "31000-31001"
    node = Node.objects.get(hostname="xm-4090-r01-n01")
    Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk).update(state="maintenance")
    first = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    second = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    third = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    ports = [i.nodes.get().ssh_port for i in (first, second, third)]
    assert sorted(p for p in ports if p) == [31000, 31001]
    assert ports[2] is None  # the range is full: no endpoint, the instance runs all the same
    assert third.state == InstanceState.RUNNING and access.ssh_access(third) is not None
    assert "-J" not in access.ssh_access(third).command  # the gateway reaches no sshd of it
    # The database refuses what a race between two writers would do.
    with pytest.raises(IntegrityError), transaction.atomic():
        InstanceNode.objects.filter(instance=third).update(ssh_port=ports[0])
    # Released, its port is free for the next one.
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(first, by="alice")
    assert first.nodes.get().ssh_port is None
    access.assign_ssh_ports(third)
    assert third.nodes.get().ssh_port == ports[0]


@pytest.mark.django_db
def test_a_key_on_another_accounts_instance_is_let_through_for_its_owner_only(
    sim_driver, alice, bob, django_capture_on_commit_callbacks
) -> None:
    """Issue 29: a key on two accounts' instances used to be let through for neither (locking its
    owner out); the gateway now lets a key through only to the account it is registered to."""
    load_fleet(parse_fleet(_fleet_text()))
    for user in (alice, bob):
        billing.grant_voucher(user, Decimal("5000"), reason="test", valid_days=30)
    console_services.add_ssh_key(alice, name="k", public_key=KEY_A)
    mine = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    theirs = run_order(bob, django_capture_on_commit_callbacks, cards=1)
    gw = Gateway.objects.get(region__code="xiamen")
    assert [g.public_key for g in access.gateway_grants(gw)] == [_canon(KEY_A)]
    # Copied into another account's order (before the console refused that key to Bob).
    type(theirs).objects.filter(pk=theirs.pk).update(ssh_public_key=mine.ssh_public_key)
    grants = access.gateway_grants(gw)
    assert [(g.public_key, g.label) for g in grants] == [(_canon(KEY_A), str(alice.public_id))]
    part = mine.nodes.select_related("node").get()
    assert grants[0].destinations == ((part.node.address, part.ssh_port),)


@pytest.mark.django_db
def test_a_key_already_on_another_account_is_refused_at_registration(alice, bob) -> None:
    from django.core.exceptions import ValidationError

    console_services.add_ssh_key(alice, name="k", public_key=KEY_A)
    api = APIClient()
    api.force_authenticate(bob)
    r = api.post(
        "/api/v1/ssh-keys/",
        {"name": "k", "public_key": KEY_A},
        format="json",
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert r.status_code == 400, r.content
    assert "another account" in r.content.decode()
    zh = api.post("/api/v1/ssh-keys/", {"name": "k", "public_key": KEY_A}, format="json")
    assert "其他账号" in zh.content.decode()  # Chinese by default
    with pytest.raises(ValidationError):
        console_services.add_ssh_key(bob, name="k", public_key=KEY_A)


# -- what the page and the API show (simulated fleet) --------------------------------------------
@pytest.mark.django_db
def test_the_page_and_the_api_show_the_command_and_the_config_block(
    sim_driver, alice, alice_client, bob_client, django_capture_on_commit_callbacks
) -> None:
    load_fleet(parse_fleet(_fleet_text()))
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    console_services.add_ssh_key(alice, name="k", public_key=KEY_A)
    inst = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    assert inst.state == InstanceState.RUNNING
    part = inst.nodes.select_related("node").get()
    port, address = part.ssh_port, part.node.address
    assert (inst.ssh_host, inst.ssh_port) == (address, port)
    command = f"ssh -J gpc@gw-xiamen.gpu-console.example:2222 root@{address} -p {port}"
    config = (
        f"Host {inst.slug}\n    HostName {address}\n    Port {port}\n    User root\n"
        "    ProxyJump gpc@gw-xiamen.gpu-console.example:2222\n"
    )
    gw = Gateway.objects.get(region__code="xiamen")
    assert gw.synced_at is not None  # the simulated gateway was written when it ran

    page = alice_client.get(reverse("slices:instance-detail", args=[inst.public_id]))
    html = page.content.decode()
    assert command in html
    assert (
        f"Host {inst.slug}" in html and "ProxyJump gpc@gw-xiamen.gpu-console.example:2222" in html
    )

    api = APIClient()
    api.force_authenticate(alice)
    data = api.get(f"/api/v1/instances/{inst.public_id}/").json()
    assert data["ssh"]["command"] == command
    assert (data["ssh"]["host"], data["ssh"]["port"], data["ssh"]["user"]) == (
        address,
        port,
        "root",
    )
    assert data["ssh"]["gateway"] == {
        "host": "gw-xiamen.gpu-console.example",
        "port": 2222,
        "user": "gpc",
    }
    assert data["ssh"]["jump"] == "gpc@gw-xiamen.gpu-console.example:2222"
    assert data["ssh_config"] == config
    listed = api.get("/api/v1/instances/").json()["results"][0]
    assert listed["ssh_config"] == config
    # Another customer sees nothing of it.
    assert (
        bob_client.get(reverse("slices:instance-detail", args=[inst.public_id])).status_code == 404
    )

    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    data = api.get(f"/api/v1/instances/{inst.public_id}/").json()
    assert data["ssh"] is None and data["ssh_config"] == ""
    html = alice_client.get(reverse("slices:instance-detail", args=[inst.public_id])).content
    assert b'id="instance-ssh"' not in html and b"ProxyJump" not in html
