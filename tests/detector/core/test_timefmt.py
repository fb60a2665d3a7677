"""Event times: one parser and one formatter for every reader and writer of `@timestamp`."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from hpcsec.detector.core import timefmt


def test_time_round_trip():
    moment = timefmt.parse_time("2026-11-30T01:02:03.456Z")
    assert timefmt.rfc3339(moment) == "2026-11-30T01:02:03.456Z"
    assert timefmt.parse_time("2026-11-30T02:02:03+01:00") == timefmt.parse_time(
        "2026-11-30T01:02:03Z"
    )
    for bad in ("yesterday", 1764464523, None, ["2026-11-30T01:02:03Z"]):
        with pytest.raises(ValueError):
            timefmt.parse_time(bad)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-30T01:02:03z",
        " 2026-11-30T01:02:03Z\n",
        "2026-11-30T01:02:03",  # no offset: UTC
        "2026-11-30 01:02:03.123456+00:00",
        "2026-11-30",  # fromisoformat reads a date; is_event_time refuses it
    ],
)
def test_what_parse_time_accepts_is_utc(text):
    moment = timefmt.parse_time(text)
    assert moment.tzinfo is UTC
    assert moment.date() == datetime(2026, 11, 30).date()


def test_formatting_trims_to_milliseconds_and_reads_naive_as_utc():
    naive = datetime(2026, 11, 30, 1, 2, 3, 999999)
    assert timefmt.rfc3339(naive) == "2026-11-30T01:02:03.999Z"
    plus_two = datetime(2026, 11, 30, 3, 2, 3, tzinfo=timezone(timedelta(hours=2)))
    assert timefmt.rfc3339(plus_two) == "2026-11-30T01:02:03.000Z"
    assert timefmt.rfc3339().endswith("Z")


@pytest.mark.parametrize(
    ("text", "is_time"),
    [
        ("2026-11-30T01:02:03Z", True),
        ("2026-11-30t01:02:03.5+02:00", True),
        ("2026-11-30 01:02:03", True),
        ("2026-11-30", False),
        ("2026-335T01:02:03Z", False),
        ("20261130T010203Z", False),
        ("2026-11-30T25:02:03Z", False),
        ("", False),
    ],
)
def test_an_event_time_is_a_full_date_and_time(text, is_time):
    assert timefmt.is_event_time(text) is is_time


def test_epoch_seconds_is_none_for_anything_but_a_time():
    assert timefmt.epoch_seconds("2026-11-30T01:00:00Z") == 1796000400.0
    for bad in ("soon", None, 1796000400, b"2026-11-30T01:00:00Z"):
        assert timefmt.epoch_seconds(bad) is None


def test_as_utc_converts_offsets_and_reads_naive_as_utc():
    assert timefmt.as_utc(datetime(2026, 1, 1)) == datetime(2026, 1, 1, tzinfo=UTC)
    east = datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    assert timefmt.as_utc(east).tzinfo is UTC
    assert timefmt.as_utc(east) == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_time_out_of_range_once_made_utc_is_not_a_time(text):
    """datetime reads them, but converting them to UTC overflows: an events file line with
    one must be a malformed line, not an OverflowError that ends the scan."""
    with pytest.raises(ValueError, match="in range"):
        timefmt.parse_time(text)
    assert timefmt.is_event_time(text) is False
    assert timefmt.epoch_seconds(text) is None


@pytest.mark.parametrize("year", [1, 9, 99, 999, 1000, 9999])
def test_every_year_is_written_with_four_digits_and_read_back(year):
    # glibc's strftime writes year 1 as `1`: an alert or a syslog header of an event a node
    # stamped so would carry a time that no RFC 3339 reader (ours included) takes back
    moment = datetime(year, 6, 1, 2, 3, 4, 5000, tzinfo=UTC)
    text = timefmt.rfc3339(moment)
    assert text == f"{year:04d}-06-01T02:03:04.005Z"
    assert timefmt.parse_time(text) == moment
    assert timefmt.year_first(moment) == f"{year:04d}-06-01 02:03:04"
