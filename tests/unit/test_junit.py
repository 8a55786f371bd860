"""The gate as JUnit XML, and the XML escaping it shares with valgrind's XML: whatever a
target names (its command line, its files) reaches a reader as it was, or as U+FFFD where
XML cannot carry a character, and never breaks the document."""

from __future__ import annotations

from xml.etree import ElementTree

from leaktrace.outputs.junit import SUITE, GateCase, render_junit
from leaktrace.outputs.valgrind_xml import xml_attribute, xml_text

HOSTILE = "./t \"q\" 'a' <b> & c\td\ne\r\x01\x7f\ud800 \U0001f600"


def parsed_cases(cases: list[GateCase]) -> ElementTree.Element:
    return ElementTree.fromstring(render_junit(cases))


def test_counts_and_each_case_s_outcome():
    root = parsed_cases(
        [
            GateCase("./ok 10", 0.5),
            GateCase("./leaks 11", 0.25, failure="definitely lost: 96 bytes in 2 blocks", output="LEAK SUMMARY: ..."),
            GateCase("./gone 12", 0.0, error="exited without being judged"),
        ]
    )
    assert root.tag == "testsuites" and root.get("name") == SUITE
    [suite] = root
    for element in (root, suite):
        assert (element.get("tests"), element.get("failures"), element.get("errors")) == ("3", "1", "1")
        assert float(element.get("time")) == 0.75
    ok, leaks, gone = suite.findall("testcase")
    assert ok.get("name") == "./ok 10" and list(ok) == []
    assert leaks.find("failure").get("message") == "definitely lost: 96 bytes in 2 blocks"
    assert leaks.find("failure").get("type") == "leak"
    assert leaks.findtext("system-out") == "LEAK SUMMARY: ..."
    assert gone.find("error").get("type") == "unjudged" and gone.find("failure") is None


def test_a_hostile_name_is_carried_whole_and_breaks_nothing():
    root = parsed_cases([GateCase(HOSTILE, 1.0, failure=HOSTILE, output=HOSTILE)])
    [case] = root.iter("testcase")
    # What XML 1.0 cannot carry (\x01, a lone surrogate) becomes U+FFFD; the rest arrives as it was
    # (a parser turns the \r of character data into \n, as XML says; attributes keep it, escaped).
    carried = HOSTILE.replace("\x01", "\ufffd").replace("\ud800", "\ufffd")
    assert case.get("name") == carried
    assert case.find("failure").get("message") == carried
    assert case.findtext("system-out") == carried.replace("\r", "\n")


def test_escapes_match_what_xml_requires():
    assert xml_text("a<b>&c") == "a&lt;b&gt;&amp;c"
    assert xml_attribute('say "x"\n') == '"say &quot;x&quot;&#10;"'
    assert xml_text("\x00\x1f ok") == "\ufffd\ufffd ok"


def test_no_cases_is_an_empty_suite():
    root = parsed_cases([])
    assert root.get("tests") == "0" and root.find("testsuite/testcase") is None
