// Starts Swagger UI on /api/v1/docs (what flask-smorest's page does inline; the CSP allows no inline script).
window.addEventListener("load", function () {
  var el = document.getElementById("swagger-ui-container");
  var config = {url: el.dataset.specUrl, dom_id: "#swagger-ui-container"};
  var extra = JSON.parse(el.dataset.config || "{}");
  for (var name in extra) { config[name] = extra[name]; }
  window.ui = SwaggerUIBundle(config);
});
