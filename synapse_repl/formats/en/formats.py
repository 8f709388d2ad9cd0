"""One time format everywhere (admin, dashboard, the live pages' script): ISO-like, 24-hour,
with the zone, instead of English locale's "Nov. 24, 2026, 6:05 a.m." beside "6:05:38 AM"."""
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
TIME_FORMAT = "H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
