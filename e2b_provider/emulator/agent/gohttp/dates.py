"""Go's HTTP dates: ``http.TimeFormat`` and ``http.ParseTime`` (IMF-fixdate, RFC 850, ANSI C).

Pure.
"""

from __future__ import annotations

import calendar
import datetime
import email.utils
import re
from typing import Optional

__all__ = ["http_date", "parse_http_date"]

_DAYS = "(?:mon|tue|wed|thu|fri|sat|sun)"
_LONG_DAYS = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MON = "(" + "|".join(_MONTHS) + ")"
_IMF = re.compile(rf"(?i:{_DAYS}), (\d\d) (?i:{_MON}) (\d{{4}}) (\d\d):(\d\d):(\d\d) GMT")
_RFC850 = re.compile(
    rf"(?i:{_LONG_DAYS}), (\d\d)-(?i:{_MON})-(\d\d) (\d\d):(\d\d):(\d\d) [A-Z]{{3,5}}"
)
_ANSIC = re.compile(rf"(?i:{_DAYS}) (?i:{_MON}) (?: ?(\d{{1,2}})) (\d\d):(\d\d):(\d\d) (\d{{4}})")


def http_date(seconds: float) -> str:
    """Go's ``http.TimeFormat`` of a Unix time (``Mon, 02 Jan 2006 15:04:05 GMT``)."""
    return email.utils.formatdate(int(seconds), usegmt=True)


def parse_http_date(text: str) -> Optional[int]:
    """Go's ``http.ParseTime`` (IMF-fixdate, RFC 850, ANSI C) as Unix seconds, else None."""
    m = _IMF.fullmatch(text)
    if m:
        day, mon, year, hh, mm, ss = m.groups()
    else:
        m = _RFC850.fullmatch(text)
        if m:
            day, mon, yy, hh, mm, ss = m.groups()
            year = str(int(yy) + (1900 if int(yy) >= 69 else 2000))
        else:
            m = _ANSIC.fullmatch(text)
            if m is None:
                return None
            mon, day, hh, mm, ss, year = m.groups()
    try:
        when = datetime.datetime(
            int(year), _MONTHS.index(mon.lower()) + 1, int(day), int(hh), int(mm), int(ss)
        )
    except ValueError:
        return None
    return calendar.timegm(when.timetuple())
