from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path, re_path, register_converter

from shop.api import views as api
from shop.ops.metrics import metrics_view
from shop.web import views
from shop.web.converters import CouponCodeConverter

register_converter(CouponCodeConverter, "couponcode")

api_patterns = [
    path("api/products/", api.products, name="api_products"),
    path("api/products/<int:product_id>/", api.product, name="api_product"),
    path("api/ping/", api.ping, name="api_ping"),
    path("api/orders/", api.orders, name="api_orders"),
    path("api/orders/<int:order_id>/", api.order, name="api_order"),
    path("api/orders/<int:order_id>/pay/", api.pay, name="api_order_pay"),
    path("api/orders/<int:order_id>/cancel/", api.cancel, name="api_order_cancel"),
    path("api/coupons/<couponcode:code>/claim/", api.claim, name="api_coupon_claim"),
    re_path(r"^api(?:/(?P<path>.*))?$", api.not_found),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    *api_patterns,
    path("", views.catalog, name="catalog"),
    path("products/<int:product_id>/", views.product_detail, name="product"),
    path("products/<int:product_id>/state/", views.product_state, name="product_state"),
    path("cart/", views.cart_view, name="cart"),
    path("checkout/", views.checkout, name="checkout"),
    path("checkout/code/", views.checkout_code, name="checkout_code"),
    path("line/<int:product_id>/", views.line_page, name="line_page"),
    path("line/<int:product_id>/state/", views.line_state, name="line_state"),
    path("orders/", views.my_orders, name="orders"),
    path("orders/<int:order_id>/", views.order_detail, name="order"),
    path("orders/<int:order_id>/pay/", views.order_pay, name="order_pay"),
    path("orders/<int:order_id>/cancel/", views.order_cancel, name="order_cancel"),
    path("coupons/", views.coupons, name="coupons"),
    path("coupons/<couponcode:code>/claim/", views.coupon_claim, name="coupon_claim"),
    path("signup/", views.signup, name="signup"),
    path("login/", views.login_view, name="login"),
    path("password-reset/", views.password_reset, name="password_reset"),
    path("password-reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("password-reset/done/", views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("password-reset/<uidb64>/<token>/", auth_views.PasswordResetConfirmView.as_view(),
         name="password_reset_confirm"),
    path("logout/", views.logout_view, name="logout"),
    path("account/tokens/", views.api_tokens, name="api_tokens"),
]
