"""Parses Prometheus text from stdin with prometheus_client's parser (a
streaming parser: a sample belongs to the family whose TYPE it follows) and
prints the families as JSON: name, type, and each sample's name and labels."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

families = [
    {
        "name": f.name,
        "type": f.type,
        "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples],
    }
    for f in text_string_to_metric_families(sys.stdin.read())
]
print(json.dumps(families))
