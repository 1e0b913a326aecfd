"""The dashboard: two HTML pages and their static JS/CSS, all served by the API itself (no CDN, no build)."""
