"""No views: the example is its tasks and a management command."""

urlpatterns: list = []
