"""The storage rule (tests/support/house_urls.py): no product code outside utils/storage/ parses gs://, s3:// or
file:// itself; the checker finds each kind of parsing and leaves messages alone."""
import pytest

from tests.support.house_urls import breaks_in, url_parsing_breaks
from tests.support.paths import REPO


def test_no_product_code_parses_a_location_outside_storage():
    assert url_parsing_breaks(REPO) == []


@pytest.mark.parametrize("line, how", [
    ('path = url.removeprefix("file://")', ".removeprefix()"),
    ('remote = url.startswith(("gs://", "s3://"))', ".startswith()"),
    ('bucket, _, rest = url.removeprefix("s3://").partition("/")', ".removeprefix()"),
    ('remote = url[:5] == "gs://"', "a comparison"),
    ('local = "file://" not in url', "a comparison"),
    ('m = re.match(r"s3://([^/]+)/(.*)", url)', "re.match"),
    ('SCHEMES = ("gs://", "s3://")', "a bare scheme constant"),
    ('path = url.replace("file://", "", 1)', ".replace()"),
])
def test_each_kind_of_parsing_is_found_in_product_code(line, how):
    found = breaks_in(f"import re\n{line}\n", "utils/data/source.py")  # one line per scheme literal
    assert found and all(f.startswith("utils/data/source.py:2: parses") and f"({how}) outside utils/storage/" in f
                         for f in found)
    assert breaks_in(f"import re\n{line}\n", "utils/storage/s3.py") == []  # the owner may


def test_messages_help_and_docstrings_may_name_the_schemes():
    source = '''"""Push to gs://bucket/prefix or s3://bucket/prefix, or a file:///path."""
p.add_argument("--data", help="a folder, gs://bucket/prefix or s3://bucket/prefix")
raise PiconeoxError(f"--data {url}: use gs://bucket/prefix, s3://bucket/prefix or file:///path")
url = f"s3://{bucket}/{prefix}"
'''
    assert breaks_in(source, "train.py") == []
